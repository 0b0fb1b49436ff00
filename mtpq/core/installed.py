"""Patch the vLLM installed in a Python environment, in place, and undo it byte for byte.

The series is applied to copies of the touched files in a scratch directory first; only when every
patch applies are the installed files changed. State lives beside the package in
`.mtpq-vllm-state/`: `originals/` (the files as they were) and `manifest.json` (each managed file's
original and patched sha256, and the series). The order of writes keeps one rule at every instant,
so that a run killed anywhere loses nothing: a file the manifest lists holds its original or its
patched bytes, its original is in `originals/`, and a file it does not list was never changed.
Hence originals are backed up and recorded before the first installed file changes, and a backup is
only ever made of a file no manifest lists, which is the original. Runs take turns (a lock on the
site-packages directory); a run first removes what a killed one left: its temporary files and unrecorded
backups.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mtpq.core import crashsafe, status
from mtpq.core.download import scratch_dir, sha256_of
from mtpq.core.gittree import TreeError
from mtpq.core.pin import release_in
from mtpq.core.series import Patch, Series
from mtpq.core.status import PatchResult

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

    @property
    def originals(self) -> Path:
        return self.state_dir / "originals"

    def manifest(self) -> dict | None:
        try:
            return json.loads(self.manifest_path.read_bytes())
        except FileNotFoundError:
            return None


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


def release_here() -> str | None:
    """The version of the vLLM this Python has installed; None where it has none."""
    try:
        return installed_version(find_installation(sys.executable))
    except TreeError:
        return None


def package_files(changes: Series | Patch) -> list[str]:
    """Paths (relative to site-packages) a series or a patch changes inside the vllm package."""
    return [path for path in changes.files if path.startswith("vllm/")]


def _current_sha(installation: Installation, relative: str) -> str | None:
    path = installation.site / relative
    return sha256_of(path) if path.exists() else None


def original_bytes(installation: Installation, relative: str, manifest: dict | None) -> bytes | None:
    """The file as it was before mtpq touched it (None: it did not exist)."""
    entry = manifest["files"].get(relative) if manifest else None
    if entry is None:
        current = installation.site / relative  # never changed: it is the original
        return current.read_bytes() if current.exists() else None
    if entry["original_sha256"] is None:
        return None
    return _checked_backup(installation, relative, entry).read_bytes()


def _checked_backup(installation: Installation, relative: str, entry: dict) -> Path:
    backup = installation.originals / relative
    if not backup.exists() or sha256_of(backup) != entry["original_sha256"]:
        raise TreeError(f"the backup of {relative} in {installation.state_dir} is missing or damaged")
    return backup


def git_apply(directory: Path, patch, *flags: str, include: str = "vllm/*") -> subprocess.CompletedProcess:
    """`git apply` of the patch's files matching `include`, in a directory that is not a repository."""
    # The ceiling keeps git from treating an enclosing repository as the place to apply.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(directory.parent)}
    return subprocess.run(
        ["git", "apply", f"--include={include}", *flags],
        cwd=directory,
        env=env,
        input=patch.data,
        capture_output=True,
        pass_fds=crashsafe.inherited_fds(),
    )


def _in_place(installation: Installation, series: Series) -> bool:
    manifest = installation.manifest()
    if not manifest or manifest["series_id"] != series.series_id:
        return False
    return all(
        _current_sha(installation, relative) == entry["patched_sha256"]
        for relative, entry in manifest["files"].items()
    )


def _stage(installation: Installation, series: Series, staging: Path) -> list[PatchResult]:
    """Apply the series to pristine copies of the touched files under `staging`."""
    manifest = installation.manifest()
    for relative in package_files(series):
        original = original_bytes(installation, relative, manifest)
        if original is not None:
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            (staging / relative).write_bytes(original)
    if _whole_series_in(staging, series):
        return [PatchResult(patch.name, status.ALREADY_UPSTREAM) for patch in series.patches]
    results: list[PatchResult] = []
    for patch in series.patches:
        if results and not results[-1].ok:
            results.append(PatchResult(patch.name, status.NOT_TRIED))
        elif git_apply(staging, patch, "--reverse", "--check").returncode == 0:
            results.append(PatchResult(patch.name, status.ALREADY_UPSTREAM))
        elif (applied := git_apply(staging, patch)).returncode == 0:
            results.append(PatchResult(patch.name, status.APPLIED))
        else:
            stderr = applied.stderr.decode(errors="replace")
            files = [f for f in patch.files if f in stderr] or list(patch.files)
            results.append(PatchResult(patch.name, status.CONFLICT, files=files, reason=stderr.strip()))
    return results


def _whole_series_in(staging: Path, series: Series) -> bool:
    """Whether the files already carry the whole series, as the mtpq wheel's do: it reverse-applies,
    last patch first. (One patch alone may not reverse once later patches changed its lines.)"""
    copy = staging.with_name("reversed")
    shutil.copytree(staging, copy)
    try:
        return all(git_apply(copy, patch, "--reverse").returncode == 0 for patch in reversed(series.patches))
    finally:
        shutil.rmtree(copy)


def apply_installed(installation: Installation, series: Series, dry_run: bool = False) -> list[PatchResult]:
    """Patch the installation (idempotent: a second run reports `already applied`)."""
    if dry_run:
        return _stage_and_commit(installation, series, commit=False)
    with _locked(installation):
        if _in_place(installation, series):
            return [PatchResult(patch.name, status.ALREADY_APPLIED) for patch in series.patches]
        return _stage_and_commit(installation, series, commit=True)


def _stage_and_commit(installation: Installation, series: Series, commit: bool) -> list[PatchResult]:
    with scratch_dir("staging") as scratch:
        staging = scratch / "site"
        staging.mkdir()
        results = _stage(installation, series, staging)
        if commit and status.all_ok(results):
            _commit(installation, series, staging)
    return results


@contextmanager
def _locked(installation: Installation) -> Iterator[None]:
    """The installation to ourselves, with what a killed run left removed first."""
    with crashsafe.exclusive_lock(installation.site, f"the vLLM installation {installation.package_dir}"):
        _remove_leftovers(installation)
        yield


def _remove_leftovers(installation: Installation) -> None:
    """A killed run's temporary files, and backups that no manifest records: a file the manifest
    does not list was never changed, so its backup is not needed."""
    manifest = installation.manifest()
    files = manifest["files"] if manifest else {}
    for relative in files:
        crashsafe.temporary_sibling(installation.site / relative).unlink(missing_ok=True)
    crashsafe.temporary_sibling(installation.manifest_path).unlink(missing_ok=True)
    if installation.originals.is_dir():
        for path in sorted(installation.originals.rglob("*"), reverse=True):  # children first
            if path.is_dir():
                if not any(path.iterdir()):
                    path.rmdir()
            elif path.relative_to(installation.originals).as_posix() not in files:
                path.unlink()


def _refuse_changed(installation: Installation, manifest: dict) -> None:
    """Every file mtpq manages holds its original or its patched bytes; anything else is the user's."""
    changed = [
        relative
        for relative, entry in manifest["files"].items()
        if _current_sha(installation, relative) not in (entry["original_sha256"], entry["patched_sha256"])
    ]
    if changed:
        raise TreeError(
            f"refusing: changed since mtpq patched them: {', '.join(changed)} (nothing was changed). "
            f"Reinstall vLLM instead, then delete {installation.state_dir}."
        )


def _commit(installation: Installation, series: Series, staging: Path) -> None:
    """Move the staged files in, keeping the rule of the module docstring at every step."""
    old = installation.manifest() or {"files": {}}
    _refuse_changed(installation, old)
    wanted = {relative: _staged_sha(staging / relative) for relative in package_files(series)}
    # Files patched otherwise than this series wants go back first: then every recorded file holds its
    # original or the bytes this series wants, and the new manifest may say so.
    for relative, entry in old["files"].items():
        current = _current_sha(installation, relative)
        if current != entry["original_sha256"] and (relative not in wanted or current != wanted[relative]):
            _restore_file(installation, relative, entry)
    files = {}
    for relative, patched_sha in wanted.items():
        entry = old["files"].get(relative) or _back_up(installation, relative)
        files[relative] = {"original_sha256": entry["original_sha256"], "patched_sha256": patched_sha}
    # Files only the old series touched are original again: they are no longer recorded.
    installation.state_dir.mkdir(exist_ok=True)
    manifest = {"series_id": series.series_id, "files": files}
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    crashsafe.write_atomic(installation.manifest_path, text.encode())
    for relative, patched_sha in wanted.items():
        if _current_sha(installation, relative) != patched_sha:
            _place(installation.site / relative, staging / relative)
    _remove_leftovers(installation)  # the backups of files the manifest no longer lists


def _staged_sha(path: Path) -> str | None:
    return sha256_of(path) if path.exists() else None


def _back_up(installation: Installation, relative: str) -> dict:
    """Back up a file no manifest lists (so never changed: the original) before it is recorded."""
    current = installation.site / relative
    if not current.exists():
        return {"original_sha256": None}
    backup = installation.originals / relative
    backup.parent.mkdir(parents=True, exist_ok=True)
    data = current.read_bytes()
    crashsafe.write_atomic(backup, data)
    return {"original_sha256": hashlib.sha256(data).hexdigest()}


def _place(target: Path, source: Path) -> None:
    """`target` becomes `source`'s content (or goes, if `source` does not exist), keeping its mode."""
    if not source.exists():
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = target.stat().st_mode if target.exists() else None
    crashsafe.write_atomic(target, source.read_bytes(), mode)


def _restore_file(installation: Installation, relative: str, entry: dict) -> None:
    if entry["original_sha256"] is None:
        (installation.site / relative).unlink(missing_ok=True)
        return
    _place(installation.site / relative, _checked_backup(installation, relative, entry))


def verify_installed(installation: Installation, series: Series) -> list[PatchResult]:
    """`already applied` for every patch when the series is fully in place, else `missing`."""
    state = status.ALREADY_APPLIED if _in_place(installation, series) else MISSING
    return [PatchResult(patch.name, state) for patch in series.patches]


def revert_installed(installation: Installation) -> list[str]:
    """Put every file mtpq changed back byte for byte; refuse if any changed since. Works from any
    state a killed run left."""
    if not installation.state_dir.exists():
        return []
    with _locked(installation):
        manifest = installation.manifest()
        if manifest is not None:
            _refuse_changed(installation, manifest)
            for relative, entry in manifest["files"].items():
                if _current_sha(installation, relative) != entry["original_sha256"]:
                    _restore_file(installation, relative, entry)
            # From here on every file is original: what is left of the state directory is garbage.
            installation.manifest_path.unlink()
        if installation.state_dir.exists():  # a run we waited for may have reverted it
            shutil.rmtree(installation.state_dir)
    return sorted(manifest["files"]) if manifest else []
