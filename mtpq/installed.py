"""Patch the vLLM installed in a Python environment, in place, and undo it byte for byte.

The series is applied to copies of the touched files in a staging directory first; only
when every patch applies are the originals backed up and the staged files moved in, so a
failure leaves site-packages as it was. The backup and a manifest live beside the package
in `.mtpq-vllm-state/`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mtpq import status
from mtpq.download import sha256_of
from mtpq.gittree import TreeError
from mtpq.pin import release_in
from mtpq.series import Series
from mtpq.status import PatchResult

STATE_DIR_NAME = ".mtpq-vllm-state"
MISSING = "missing"
# find_spec locates the package without running its __init__ (which would need torch).
_FIND_VLLM = (
    "import importlib.util as u, json; s = u.find_spec('vllm'); "
    "print(json.dumps(s and s.submodule_search_locations[0]))"
)


@dataclass(frozen=True)
class Installation:
    python: str
    package_dir: Path  # .../site-packages/vllm

    @property
    def site(self) -> Path:
        return self.package_dir.parent

    @property
    def state_dir(self) -> Path:
        return self.site / STATE_DIR_NAME

    @property
    def manifest_path(self) -> Path:
        return self.state_dir / "manifest.json"

    def manifest(self) -> dict | None:
        return json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else None


def find_installation(python: str) -> Installation:
    """Locate the vllm package of `python` without importing it (no torch needed)."""
    try:
        found = subprocess.run([python, "-c", _FIND_VLLM], capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise TreeError(f"no Python interpreter at {python}") from None
    except subprocess.CalledProcessError as error:
        raise TreeError(f"{python} could not be queried: {error.stderr.strip()}") from None
    location = json.loads(found.stdout)
    if location is None:
        raise TreeError(f"no vLLM is installed in the environment of {python}")
    return Installation(python=python, package_dir=Path(location))


def installed_version(installation: Installation) -> str:
    found = release_in(installation.package_dir)
    if found is None:
        raise TreeError(f"{installation.package_dir}/_version.py is missing: cannot tell the vLLM version")
    return found


def _package_files(series: Series) -> list[str]:
    """Paths (relative to site-packages) the series changes inside the vllm package."""
    return [path for path in series.files if path.startswith("vllm/")]


def _original_bytes(installation: Installation, relative: str, manifest: dict | None) -> bytes | None:
    """The file as it was before mtpq touched it (None: it did not exist)."""
    if manifest and relative in manifest["files"]:
        entry = manifest["files"][relative]
        if entry["original_sha256"] is None:
            return None
        return (installation.state_dir / "originals" / relative).read_bytes()
    current = installation.site / relative
    return current.read_bytes() if current.exists() else None


def _git_apply(staging: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess:
    # The ceiling keeps git from treating an enclosing repository as the place to apply.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(staging.parent)}
    return subprocess.run(
        ["git", "apply", "--include=vllm/*", *flags, str(patch)],
        cwd=staging,
        env=env,
        capture_output=True,
        text=True,
    )


def _in_place(installation: Installation, series: Series) -> bool:
    manifest = installation.manifest()
    if not manifest or manifest["series_id"] != series.series_id:
        return False
    return all(
        _current_sha(installation, relative) == entry["patched_sha256"]
        for relative, entry in manifest["files"].items()
    )


def _current_sha(installation: Installation, relative: str) -> str | None:
    path = installation.site / relative
    return sha256_of(path) if path.exists() else None


def _stage(installation: Installation, series: Series, staging: Path) -> list[PatchResult]:
    """Apply the series to pristine copies of the touched files under `staging`."""
    manifest = installation.manifest()
    for relative in _package_files(series):
        original = _original_bytes(installation, relative, manifest)
        if original is not None:
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            (staging / relative).write_bytes(original)
    if _whole_series_in(staging, series):
        return [PatchResult(patch.name, status.ALREADY_UPSTREAM) for patch in series.patches]
    results: list[PatchResult] = []
    for patch in series.patches:
        if results and not results[-1].ok:
            results.append(PatchResult(patch.name, status.NOT_TRIED))
        elif _git_apply(staging, patch.path, "--reverse", "--check").returncode == 0:
            results.append(PatchResult(patch.name, status.ALREADY_UPSTREAM))
        elif (applied := _git_apply(staging, patch.path)).returncode == 0:
            results.append(PatchResult(patch.name, status.APPLIED))
        else:
            files = [f for f in patch.files if f in applied.stderr] or list(patch.files)
            results.append(
                PatchResult(patch.name, status.CONFLICT, files=files, reason=applied.stderr.strip())
            )
    return results


def _whole_series_in(staging: Path, series: Series) -> bool:
    """Whether the files already carry the whole series, as the mtpq wheel's do: it reverse-applies,
    last patch first. (One patch alone may not reverse once later patches changed its lines.)"""
    with tempfile.TemporaryDirectory(prefix="mtpq-reverse-") as scratch:
        copy = Path(scratch) / "site"
        shutil.copytree(staging, copy)
        return all(
            _git_apply(copy, patch.path, "--reverse").returncode == 0 for patch in reversed(series.patches)
        )


def apply_installed(installation: Installation, series: Series, dry_run: bool = False) -> list[PatchResult]:
    """Patch the installation (idempotent: a second run reports `already applied`)."""
    if _in_place(installation, series):
        return [PatchResult(patch.name, status.ALREADY_APPLIED) for patch in series.patches]
    with tempfile.TemporaryDirectory(prefix="mtpq-staging-") as scratch:
        staging = Path(scratch) / "site"
        staging.mkdir()
        results = _stage(installation, series, staging)
        if dry_run or not status.all_ok(results):
            return results
        _commit(installation, series, staging)
    return results


def _commit(installation: Installation, series: Series, staging: Path) -> None:
    """Back up originals (once), then move the staged files in and record the manifest."""
    old = installation.manifest() or {"files": {}}
    files = {}
    for relative in _package_files(series):
        entry = old["files"].get(relative)
        if entry is None:
            current = installation.site / relative
            entry = {"original_sha256": sha256_of(current) if current.exists() else None}
            if current.exists():
                backup = installation.state_dir / "originals" / relative
                backup.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(current, backup)
        staged = staging / relative
        entry["patched_sha256"] = sha256_of(staged) if staged.exists() else None
        files[relative] = entry
    # Files an earlier series touched but this one does not go back to their originals.
    for relative in set(old["files"]) - set(files):
        _restore_file(installation, relative, old["files"][relative])
    for relative in files:
        _place(installation.site / relative, staging / relative)
    manifest = {"series_id": series.series_id, "files": files}
    installation.state_dir.mkdir(exist_ok=True)
    temporary = installation.manifest_path.with_suffix(".tmp")
    temporary.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    temporary.replace(installation.manifest_path)


def _place(target: Path, source: Path) -> None:
    if not source.exists():
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.mtpq-tmp")
    shutil.copyfile(source, temporary)
    if target.exists():
        shutil.copymode(target, temporary)
    temporary.replace(target)


def _restore_file(installation: Installation, relative: str, entry: dict) -> None:
    target = installation.site / relative
    if entry["original_sha256"] is None:
        target.unlink(missing_ok=True)
        return
    backup = installation.state_dir / "originals" / relative
    if not backup.exists() or sha256_of(backup) != entry["original_sha256"]:
        raise TreeError(f"the backup of {relative} in {installation.state_dir} is missing or damaged")
    _place(target, backup)


def verify_installed(installation: Installation, series: Series) -> list[PatchResult]:
    """`already applied` for every patch when the series is fully in place, else `missing`."""
    state = status.ALREADY_APPLIED if _in_place(installation, series) else MISSING
    return [PatchResult(patch.name, state) for patch in series.patches]


def revert_installed(installation: Installation) -> list[str]:
    """Put every file mtpq changed back byte for byte; refuse if any changed since."""
    manifest = installation.manifest()
    if manifest is None:
        return []
    changed = [
        relative
        for relative, entry in manifest["files"].items()
        if _current_sha(installation, relative) != entry["patched_sha256"]
    ]
    if changed:
        raise TreeError(
            f"refusing to revert: changed since mtpq patched them: {', '.join(changed)}. "
            f"Reinstall vLLM instead, then delete {installation.state_dir}."
        )
    for relative, entry in manifest["files"].items():
        _restore_file(installation, relative, entry)
    shutil.rmtree(installation.state_dir)
    return sorted(manifest["files"])
