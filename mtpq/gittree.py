"""Apply, check and export the series on a vLLM git checkout.

Every run first plans the whole series in a throw-away index (`GIT_INDEX_FILE`), so a
conflict is found before the user's tree, branch or index is touched. Only a plan in which
every patch applies is then committed with `git am`, one commit per patch.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from mtpq import status
from mtpq.download import cache_root, fetch
from mtpq.pin import Artifact, Pin, release_in, release_tag
from mtpq.series import Patch, Series, load_series, parse_patch
from mtpq.status import PatchResult

# Fixed identity and date for commits mtpq makes itself, so the same inputs give the same ids.
MTPQ_IDENT = {
    "GIT_AUTHOR_NAME": "mtpq",
    "GIT_AUTHOR_EMAIL": "mtpq@localhost",
    "GIT_COMMITTER_NAME": "mtpq",
    "GIT_COMMITTER_EMAIL": "mtpq@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
_FAILED_PATH = re.compile(r"^error: (?:patch failed: )?(.+?)(?::\d+)?(?:: .*)?$", re.MULTILINE)
_REJECTED_HUNK = re.compile(r"^error: patch failed: ", re.MULTILINE)
_FILE_ERROR = re.compile(r"^error: (.+?): ", re.MULTILINE)  # e.g. "error: PATH: does not exist in index"


class TreeError(RuntimeError):
    """A tree mtpq refuses to work on; nothing was changed."""


def _git_module():
    if shutil.which("git") is None:
        raise TreeError("git is not installed or not on PATH; install git and run again")
    import git  # GitPython refuses to import without a git executable

    return git


def open_repo(path: Path):
    git = _git_module()
    if not (path / "vllm" / "__init__.py").is_file():
        raise TreeError(f"{path} is not a vLLM source tree (no vllm/__init__.py)")
    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise TreeError(
            f"{path} is a vLLM tree but not a git repository; mtpq commits each patch, so it needs "
            f"one. Either run `git init && git add -A && git commit -m 'vLLM baseline'` there "
            f"first, or patch an installed vLLM with `apply.py --installed`."
        ) from None
    if Path(repo.working_tree_dir).resolve() != path.resolve():
        raise TreeError(f"{path} is inside the git repository {repo.working_tree_dir}, not its top level")
    return repo


def tree_version(repo) -> str:
    """The vLLM release a checkout is based on: vllm/_version.py, else the nearest tag."""
    if release := release_in(Path(repo.working_tree_dir) / "vllm"):
        return release
    try:
        return repo.git.describe("--tags", "--abbrev=0").removeprefix("v")
    except _git_module().GitCommandError:
        raise TreeError(
            f"cannot tell which vLLM version {repo.working_tree_dir} is: no vllm/_version.py and no tag"
        ) from None


def check_clean(repo) -> None:
    git_dir = Path(repo.git_dir)
    for marker in ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD"):
        if (git_dir / marker).exists():
            raise TreeError(
                f"{repo.working_tree_dir} has a git operation in progress ({marker}); "
                "finish or abort it first"
            )
    dirty = repo.git.status("--porcelain").splitlines()
    if dirty:
        shown = "\n  ".join(dirty[:10]) + ("\n  ..." if len(dirty) > 10 else "")
        raise TreeError(
            f"{repo.working_tree_dir} has uncommitted changes; commit or stash them first "
            f"(nothing was changed):\n  {shown}"
        )


@contextmanager
def _scratch_index(
    repo, revision: str = "HEAD", borrow_objects_from: Sequence[Path] = ()
) -> Iterator[dict[str, str]]:
    """An environment whose git index is a private copy of `revision`'s tree, and in which git may
    also read the objects of the repositories (git dirs) in `borrow_objects_from`."""
    with tempfile.TemporaryDirectory(prefix="mtpq-index-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        if borrow_objects_from:
            objects = [str(Path(git_dir).resolve() / "objects") for git_dir in borrow_objects_from]
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = os.pathsep.join(objects)
        repo.git.read_tree(revision, env=env)
        yield env


def _applies(repo, patch: Path, *flags: str, env: dict[str, str]) -> tuple[bool, str]:
    try:
        repo.git.apply("--cached", *flags, str(patch), env=env)
        return True, ""
    except _git_module().GitCommandError as error:
        return False, str(error.stderr)


def _whole_series_upstream(repo, series: Series, revision: str) -> bool:
    """Whether `revision` already carries the whole series: it reverse-applies, last patch first.
    (One patch alone may not reverse once later patches changed the lines around it.)"""
    with _scratch_index(repo, revision) as env:
        return all(_applies(repo, patch.path, "--reverse", env=env)[0] for patch in reversed(series.patches))


def _failed_hunks(repo, patch: Patch, env: dict[str, str]) -> int:
    """How many of the patch's hunks do not apply. With --reject, git checks every hunk instead of
    stopping at a file's first failure; a file it cannot patch at all (absent, or present where the
    patch creates it) fails all its hunks."""
    _, _, stderr = repo.git.apply(
        "--cached",
        "--check",
        "--reject",
        str(patch.path),
        env=env,
        with_extended_output=True,
        with_exceptions=False,
    )
    rejected = len(_REJECTED_HUNK.findall(stderr))
    unpatchable = {path for path in _FILE_ERROR.findall(stderr) if path in patch.hunks}
    return rejected + sum(patch.hunks[path] for path in unpatchable)


def _try_patch(repo, patch: Patch, env: dict[str, str]) -> PatchResult:
    """Apply one patch to the scratch index in `env`; a conflict leaves that index as it was."""
    if _applies(repo, patch.path, "--reverse", "--check", env=env)[0]:
        return PatchResult(patch.name, status.ALREADY_UPSTREAM)
    clean, stderr = _applies(repo, patch.path, env=env)
    if clean:
        return PatchResult(patch.name, status.APPLIED)
    index = Path(env["GIT_INDEX_FILE"])
    before_merge = index.with_name("index-before-3way")
    shutil.copyfile(index, before_merge)
    merged, merge_stderr = _applies(repo, patch.path, "--3way", env=env)
    if merged:
        return PatchResult(patch.name, status.APPLIED_3WAY)
    unmerged = repo.git.ls_files("--unmerged", env=env).splitlines()
    files = {line.split("\t", 1)[1] for line in unmerged}
    files |= {path for path in _FAILED_PATH.findall(stderr + merge_stderr) if path in patch.files}
    before_merge.replace(index)  # drops what the merge left (conflict stages, files it did merge)
    return PatchResult(
        patch.name,
        status.CONFLICT,
        files=sorted(files) or list(patch.files),
        failed_hunks=_failed_hunks(repo, patch, env),
    )


def plan(
    repo,
    series: Series,
    revision: str = "HEAD",
    keep_going: bool = False,
    borrow_objects_from: Sequence[Path] = (),
) -> list[PatchResult]:
    """What applying the series on `revision` would do, without touching the tree or its index.

    The first conflict ends the plan (the later patches are `not tried`), unless `keep_going`: then
    a conflicting patch is skipped and every later one is tried on top of those that applied.
    A 3-way merge needs the blobs a patch was made against; `borrow_objects_from` lends it the
    objects of other repositories (git dirs), e.g. of the release the series was made on.
    """
    if _whole_series_upstream(repo, series, revision):
        return [PatchResult(patch.name, status.ALREADY_UPSTREAM) for patch in series.patches]
    results: list[PatchResult] = []
    with _scratch_index(repo, revision, borrow_objects_from) as env:
        for patch in series.patches:
            if not keep_going and results and not results[-1].ok:
                results.append(PatchResult(patch.name, status.NOT_TRIED))
            else:
                results.append(_try_patch(repo, patch, env))
    return results


def _committer_env(repo) -> dict[str, str]:
    """git am needs a committer identity; lend mtpq's only where the user has none."""
    reader = repo.config_reader()
    if reader.has_option("user", "name") and reader.has_option("user", "email"):
        return {}
    return {key: value for key, value in MTPQ_IDENT.items() if key.startswith("GIT_COMMITTER_")}


def _restore(repo, start_branch: str | None, start_commit: str, created_branch: str | None) -> None:
    if (Path(repo.git_dir) / "rebase-apply").exists():
        repo.git.am("--abort")
    repo.git.checkout("--force", start_branch or start_commit)
    if created_branch:
        repo.git.branch("-D", created_branch)


def apply_series(repo, series: Series, branch: str, keep_conflict: bool = False) -> list[PatchResult]:
    """Commit the series onto `branch` (created from HEAD unless it is the current branch).

    On a conflict the tree is left exactly as found, unless `keep_conflict` asks to stop
    mid-`git am` on the branch so the user can resolve it.
    """
    check_clean(repo)
    results = plan(repo, series)
    if not status.all_ok(results) and not keep_conflict:
        return results
    queue = [p for p, r in zip(series.patches, results, strict=True) if r.status != status.ALREADY_UPSTREAM]

    start_branch = None if repo.head.is_detached else repo.active_branch.name
    start_commit = repo.head.commit.hexsha
    created_branch = None
    if start_branch != branch:
        if branch in [head.name for head in repo.heads]:
            raise TreeError(
                f"branch {branch} already exists in {repo.working_tree_dir}; check it out to re-run "
                f"on it, delete it, or pass --branch NAME"
            )
        try:
            repo.git.checkout("-b", branch)
        except _git_module().GitCommandError as error:  # e.g. a branch "mtpq" blocks "mtpq/v0.22.1"
            raise TreeError(
                f"cannot create branch {branch} in {repo.working_tree_dir}: "
                f"{str(error.stderr).strip()}; pass --branch NAME"
            ) from error
        created_branch = branch
    if not queue:
        return results
    try:
        repo.git.am(
            "--3way",
            "--keep-non-patch",
            "--committer-date-is-author-date",
            *[str(p.path) for p in queue],
            env=_committer_env(repo),
        )
    except _git_module().GitCommandError as error:
        if keep_conflict:
            return results
        # `git am` numbers its queue from 1 in rebase-apply/next: that is the patch it stopped on.
        stopped_at = int((Path(repo.git_dir) / "rebase-apply" / "next").read_text()) - 1
        _restore(repo, start_branch, start_commit, created_branch)
        failed = next(r for r in results if r.name == queue[stopped_at].name)
        failed.status, failed.reason = status.FAILED, str(error.stderr).strip() or "git am failed"
    return results


def export_series(repo, base: str | None, directory: Path) -> Series:
    """Rewrite `directory` (patch files and series) from the commits base..HEAD.

    A commit whose subject matches a patch already in the series keeps that file's name.
    """
    if base is None:
        base = repo.git.describe("--tags", "--abbrev=0")
    old = load_series(directory)
    if old.shared_patches:
        shared = ", ".join(str(patch.path.relative_to(directory.parent)) for patch in old.shared_patches)
        raise TreeError(
            f"{directory} lists patch files of another series ({shared}); exporting would rewrite "
            f"them. Export into a copy of the series that owns them, or into a new directory's copy."
        )
    old_by_subject = {patch.subject: patch.name for patch in old.patches}
    with tempfile.TemporaryDirectory(prefix="mtpq-export-") as scratch:
        exported = repo.git.format_patch(
            "--no-signature", "--no-numbered", "--zero-commit", "--full-index", "-o", scratch, f"{base}..HEAD"
        ).splitlines()
        if not exported:
            raise TreeError(
                f"no commits between {base} and HEAD in {repo.working_tree_dir}; nothing to export"
            )
        fresh = [parse_patch(Path(path)) for path in exported]
        names = [old_by_subject.get(patch.subject, patch.name) for patch in fresh]
        for patch in old.patches:
            patch.path.unlink()
        for patch, name in zip(fresh, names, strict=True):
            shutil.copyfile(patch.path, directory / name)
    _rewrite_series_file(directory / "series", names)
    return load_series(directory)


def _rewrite_series_file(series_file: Path, names: list[str]) -> None:
    """Fill the file's entry lines with `names` in order, keeping its comments and blank lines."""
    remaining = iter(names)
    lines = []
    for line in series_file.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            lines.append(line)
        elif (name := next(remaining, None)) is not None:
            lines.append(name)
    lines += list(remaining)
    series_file.write_text("\n".join(lines) + "\n")


def _safe_extract(archive: tarfile.TarFile, destination: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(destination, filter="data")
        return
    for member in archive.getmembers():
        target = (destination / member.name).resolve()
        if not str(target).startswith(str(destination.resolve())) or member.issym() or member.islnk():
            raise TreeError(f"refusing unsafe sdist member {member.name}")
    archive.extractall(destination)


def sdist_tree(version: str, sdist: Artifact) -> Path:
    """A git repository of a release's sdist (tag v<version> on the baseline), built once and cached."""
    root = cache_root() / "src" / f"vllm-{version}"
    if (root / ".git").is_dir():
        return root
    git = _git_module()
    archive_path = fetch(sdist)
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".unpack-") as scratch:
        with tarfile.open(archive_path) as archive:
            _safe_extract(archive, Path(scratch))
        (unpacked,) = Path(scratch).iterdir()
        repo = git.Repo.init(unpacked, initial_branch="main")
        repo.git.add("--all", "--force")
        message = f"vLLM {version} (PyPI sdist, sha256 {sdist.sha256})"
        repo.git.commit("--quiet", "--no-verify", "-m", message, env=MTPQ_IDENT)
        repo.git.tag(release_tag(version))
        unpacked.rename(root)
    return root


def pinned_tree(pin: Pin) -> Path:
    """The cached git repository of a pinned release's sdist."""
    return sdist_tree(pin.version, pin.artifacts["sdist"])


def reset_pinned_branch(repo, pin: Pin) -> None:
    """The managed tree is rebuilt on every run: the series branch restarts from the baseline tag."""
    check_clean(repo)
    repo.git.checkout("--quiet", "-B", pin.branch, pin.tag)
