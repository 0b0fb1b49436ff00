"""Apply, check and export the series on a vLLM git checkout, with git alone.

Every run builds the series in a private git index: each patch is applied there and committed with
git's plumbing, author, date and message kept as `git am` keeps them. A conflict is found, and the
commits are made, before the user's branch, index or work tree is touched. Only then is the tree
switched to the series branch: the branch is set, the index and work tree are moved from the start
commit to the series commit, and HEAD follows. A journal in the git directory records the switch
first, so that a run killed at any point is put back exactly by the next one, which then does its own
work. Runs on one tree take turns (a lock in the git directory).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mtpq import output
from mtpq.core import crashsafe, status
from mtpq.core.download import cache_root, fetch, scratch_dir
from mtpq.core.errors import MtpqError
from mtpq.core.pin import Artifact, Pin, release_in, release_tag
from mtpq.core.series import Patch, Series, load_series, parse_patch, write_series
from mtpq.core.status import PatchResult

# Fixed identity and date for commits mtpq makes itself, so the same inputs give the same ids.
MTPQ_IDENT = {
    "GIT_AUTHOR_NAME": "mtpq",
    "GIT_AUTHOR_EMAIL": "mtpq@localhost",
    "GIT_COMMITTER_NAME": "mtpq",
    "GIT_COMMITTER_EMAIL": "mtpq@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
NO_COMMIT = "0" * 40
_FAILED_PATH = re.compile(r"^error: (?:patch failed: )?(.+?)(?::\d+)?(?:: .*)?$", re.MULTILINE)
_REJECTED_HUNK = re.compile(r"^error: patch failed: ", re.MULTILINE)
_FILE_ERROR = re.compile(r"^error: (.+?): ", re.MULTILINE)  # e.g. "error: PATH: does not exist in index"
JOURNAL = "mtpq-run.json"
_UNPACKING = ".mtpq-unpack-"  # a release's tree being built
# A git operation in progress, as git itself marks it.
_IN_PROGRESS = ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD")


class TreeError(MtpqError, RuntimeError):
    """A tree mtpq refuses to work on; nothing was changed."""


class GitError(TreeError):
    """A git command failed."""


def _git(args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None, input: bytes | None = None):
    if shutil.which("git") is None:
        raise TreeError("git is not installed or not on PATH; install git and run again")
    # No automatic gc: a detached gc would inherit the run's lock and hold the tree for minutes.
    # LC_ALL=C: the conflict report parses git's messages.
    return subprocess.run(
        ["git", "-c", "gc.auto=0", "-c", "maintenance.auto=false", *args],
        cwd=cwd,
        env={**os.environ, "LC_ALL": "C", **(env or {})},
        input=input,
        capture_output=True,
        pass_fds=crashsafe.inherited_fds(),
    )


def _text(data: bytes) -> str:
    return data.decode(errors="surrogateescape")


@dataclass(frozen=True)
class Repo:
    root: Path  # the top of the work tree
    git_dir: Path  # this work tree's own: HEAD, index, the run's lock and journal
    common_dir: Path  # shared with linked work trees: refs, objects

    def run(self, *args: str, env: Mapping[str, str] | None = None, input: bytes | None = None):
        return _git(args, self.root, env, input)

    def git(self, *args: str, env: Mapping[str, str] | None = None, input: bytes | None = None) -> str:
        """stdout of a git command that must succeed."""
        done = self.run(*args, env=env, input=input)
        if done.returncode != 0:
            raise GitError(f"`git {args[0]}` failed in {self.root}: {_text(done.stderr).strip()}")
        return _text(done.stdout)

    def commit_of(self, revision: str) -> str | None:
        done = self.run("rev-parse", "--quiet", "--verify", f"{revision}^{{commit}}")
        return _text(done.stdout).strip() if done.returncode == 0 else None

    def blob(self, revision: str, path: str) -> bytes | None:
        """A file's content at a revision (None: not there)."""
        done = self.run("cat-file", "blob", f"{revision}:{path}")
        return done.stdout if done.returncode == 0 else None


def open_repo(path: Path) -> Repo:
    if not (path / "vllm" / "__init__.py").is_file():
        raise TreeError(f"{path} is not a vLLM source tree (no vllm/__init__.py)")
    done = _git(["rev-parse", "--show-toplevel", "--absolute-git-dir", "--git-common-dir"], path)
    if done.returncode != 0:
        raise TreeError(
            f"{path} is a vLLM tree but not a git repository; mtpq commits each patch, so it needs "
            f"one. Either run `git init && git add -A && git commit -m 'vLLM baseline'` there "
            f"first, or patch an installed vLLM with `apply.py --installed`."
        )
    top, git_dir, common_dir = _text(done.stdout).splitlines()
    if Path(top).resolve() != path.resolve():
        raise TreeError(f"{path} is inside the git repository {top}, not its top level")
    return Repo(Path(top), Path(git_dir), (path / common_dir).resolve())


def tree_version(repo: Repo) -> str:
    """The vLLM release a checkout is based on: vllm/_version.py, else the nearest tag."""
    if release := release_in(repo.root / "vllm"):
        return release
    done = repo.run("describe", "--tags", "--abbrev=0")
    if done.returncode != 0:
        raise TreeError(f"cannot tell which vLLM version {repo.root} is: no vllm/_version.py and no tag")
    return _text(done.stdout).strip().removeprefix("v")


def check_clean(repo: Repo) -> None:
    for marker in _IN_PROGRESS:
        if (repo.git_dir / marker).exists():
            raise TreeError(
                f"{repo.root} has a git operation in progress ({marker}); finish or abort it first"
            )
    for lock in (repo.git_dir / "index.lock", repo.git_dir / "HEAD.lock"):
        if lock.exists():
            raise TreeError(
                f"{lock} exists: a git command is running in {repo.root}, or one was killed. If none "
                f"is running, remove that file and run again (nothing was changed)."
            )
    dirty = repo.git("status", "--porcelain").splitlines()
    if dirty:
        shown = "\n  ".join(dirty[:10]) + ("\n  ..." if len(dirty) > 10 else "")
        raise TreeError(
            f"{repo.root} has uncommitted changes; commit or stash them first "
            f"(nothing was changed):\n  {shown}"
        )


@contextmanager
def _scratch_index(
    repo: Repo, revision: str = "HEAD", borrow_objects_from: Sequence[Path] = ()
) -> Iterator[dict[str, str]]:
    """An environment whose git index is a private copy of `revision`'s tree, and in which git may
    also read the objects of the repositories (git dirs) in `borrow_objects_from`."""
    with scratch_dir("index") as scratch:
        env = {"GIT_INDEX_FILE": str(scratch / "index")}
        if borrow_objects_from:
            objects = [str(Path(git_dir).resolve() / "objects") for git_dir in borrow_objects_from]
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = os.pathsep.join(objects)
        repo.git("read-tree", revision, env=env)
        yield env


def _applies(repo: Repo, patch: Patch, *flags: str, env: dict[str, str]) -> tuple[bool, str]:
    done = repo.run("apply", "--cached", *flags, env=env, input=patch.data)
    return done.returncode == 0, _text(done.stderr)


def _whole_series_upstream(repo: Repo, series: Series, revision: str) -> bool:
    """Whether `revision` already carries the whole series: it reverse-applies, last patch first.
    (One patch alone may not reverse once later patches changed the lines around it.)"""
    with _scratch_index(repo, revision) as env:
        return all(_applies(repo, patch, "--reverse", env=env)[0] for patch in reversed(series.patches))


def _failed_hunks(repo: Repo, patch: Patch, env: dict[str, str]) -> int:
    """How many of the patch's hunks do not apply. With --reject, git checks every hunk instead of
    stopping at a file's first failure; a file it cannot patch at all (absent, or present where the
    patch creates it) fails all its hunks."""
    _, stderr = _applies(repo, patch, "--check", "--reject", env=env)
    rejected = len(_REJECTED_HUNK.findall(stderr))
    unpatchable = {path for path in _FILE_ERROR.findall(stderr) if path in patch.hunks}
    return rejected + sum(patch.hunks[path] for path in unpatchable)


def _try_patch(repo: Repo, patch: Patch, env: dict[str, str]) -> PatchResult:
    """Apply one patch to the scratch index in `env`; a conflict leaves that index as it was."""
    if _applies(repo, patch, "--reverse", "--check", env=env)[0]:
        return PatchResult(patch.name, status.ALREADY_UPSTREAM)
    clean, stderr = _applies(repo, patch, env=env)
    if clean:
        return PatchResult(patch.name, status.APPLIED)
    index = Path(env["GIT_INDEX_FILE"])
    before_merge = index.with_name("index-before-3way")
    shutil.copyfile(index, before_merge)
    merged, merge_stderr = _applies(repo, patch, "--3way", env=env)
    if merged:
        return PatchResult(patch.name, status.APPLIED_3WAY)
    unmerged = repo.git("ls-files", "--unmerged", env=env).splitlines()
    files = {line.split("\t", 1)[1] for line in unmerged}
    files |= {path for path in _FAILED_PATH.findall(stderr + merge_stderr) if path in patch.files}
    before_merge.replace(index)  # drops what the merge left (conflict stages, files it did merge)
    return PatchResult(
        patch.name,
        status.CONFLICT,
        files=sorted(files) or list(patch.files),
        failed_hunks=_failed_hunks(repo, patch, env),
    )


def _committer_env(repo: Repo) -> dict[str, str]:
    """Commits need a committer identity; lend mtpq's only where the user has none."""
    configured = all(repo.run("config", key).returncode == 0 for key in ("user.name", "user.email"))
    if configured:
        return {}
    return {key: value for key, value in MTPQ_IDENT.items() if key.startswith("GIT_COMMITTER_")}


def _commit_patch(repo: Repo, patch: Patch, parent: str, env: dict[str, str], committer: dict) -> str:
    """Commit the scratch index in `env` on `parent` as `git am --keep-non-patch
    --committer-date-is-author-date` commits `patch`: the same author, date and message."""
    scratch = Path(env["GIT_INDEX_FILE"]).parent
    info = repo.git("mailinfo", "-b", str(scratch / "msg"), str(scratch / "patch"), input=patch.data)
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
    body = (scratch / "msg").read_bytes()
    message = repo.git("stripspace", input=fields.get("Subject", "").encode() + b"\n\n" + body)
    dated = {
        "GIT_AUTHOR_NAME": fields.get("Author", ""),
        "GIT_AUTHOR_EMAIL": fields.get("Email", ""),
        "GIT_AUTHOR_DATE": fields.get("Date", ""),
        "GIT_COMMITTER_DATE": fields.get("Date", ""),
    }
    tree = repo.git("write-tree", env=env).strip()
    return repo.git(
        "commit-tree", tree, "-p", parent, env={**env, **committer, **dated}, input=message.encode()
    ).strip()


def _build(
    repo: Repo,
    series: Series,
    revision: str,
    keep_going: bool = False,
    borrow_objects_from: Sequence[Path] = (),
    commit: bool = False,
) -> tuple[list[PatchResult], str]:
    """Plan the series on `revision` in a scratch index; with `commit`, also commit each patch that
    applies there, up to the first conflict. Returns the results and the last commit."""
    head = repo.commit_of(revision)
    if head is None:
        raise TreeError(f"{revision} is not a commit in {repo.root}")
    if _whole_series_upstream(repo, series, head):
        return [PatchResult(patch.name, status.ALREADY_UPSTREAM) for patch in series.patches], head
    committer = _committer_env(repo) if commit else {}
    results: list[PatchResult] = []
    with _scratch_index(repo, head, borrow_objects_from) as env:
        for patch in series.patches:
            if not keep_going and results and not results[-1].ok:
                results.append(PatchResult(patch.name, status.NOT_TRIED))
                continue
            results.append(_try_patch(repo, patch, env))
            if commit and results[-1].status in (status.APPLIED, status.APPLIED_3WAY):
                head = _commit_patch(repo, patch, head, env, committer)
    return results, head


def plan(
    repo: Repo,
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
    return _build(repo, series, revision, keep_going, borrow_objects_from)[0]


def series_commit(repo: Repo, series: Series, revision: str) -> tuple[list[PatchResult], str]:
    """The series committed on `revision` (only in the object store: no ref, index or file changes)."""
    return _build(repo, series, revision, commit=True)


@dataclass(frozen=True)
class _Head:
    branch: str | None  # None: detached
    commit: str


def _head(repo: Repo) -> _Head:
    branch = repo.run("symbolic-ref", "--quiet", "--short", "HEAD")
    commit = repo.commit_of("HEAD")
    if commit is None:
        raise TreeError(f"{repo.root} has no commit checked out")
    return _Head(_text(branch.stdout).strip() if branch.returncode == 0 else None, commit)


@contextmanager
def _run_lock(repo: Repo, recover: bool = True) -> Iterator[None]:
    """This tree to ourselves; with `recover`, what an interrupted run left put back first."""
    with crashsafe.exclusive_lock(repo.git_dir, f"the git tree {repo.root}"):
        journal = _read_journal(repo)
        if journal is not None:
            if not recover:
                raise TreeError(
                    f"an interrupted apply.py run left {repo.root} switching to branch "
                    f"{journal['branch']}; run apply.py without --check to put it back"
                )
            _recover(repo, journal)
        yield


def _read_journal(repo: Repo) -> dict | None:
    try:
        return json.loads((repo.git_dir / JOURNAL).read_bytes())
    except FileNotFoundError:
        return None


def check_series(repo: Repo, series: Series, revision: str = "HEAD") -> list[PatchResult]:
    """--check: the plan on a clean tree, changing nothing."""
    with _run_lock(repo, recover=False):
        check_clean(repo)
        return plan(repo, series, revision)


def apply_series(
    repo: Repo,
    series: Series,
    branch: str,
    base: str = "HEAD",
    replace_branch: bool = False,
    keep_conflict: bool = False,
) -> list[PatchResult]:
    """Commit the series on `base` and check it out as `branch`.

    `branch` is created, unless it is the current branch (or `replace_branch`: it is reset, as the
    managed tree's is on every run). On a conflict the tree is left exactly as found, unless
    `keep_conflict` asks to stop mid-`git am` on the branch so the user can resolve it.
    """
    with _run_lock(repo):
        check_clean(repo)
        start = _head(repo)
        branch_before = repo.commit_of(f"refs/heads/{branch}")
        if branch_before is not None and branch != start.branch and not replace_branch:
            raise TreeError(
                f"branch {branch} already exists in {repo.root}; check it out to re-run "
                f"on it, delete it, or pass --branch NAME"
            )
        results, target = series_commit(repo, series, base)
        if not status.all_ok(results) and not keep_conflict:
            return results
        journal = {
            "pid": os.getpid(),
            "time": time.time(),
            "branch": branch,
            "branch_before": branch_before,
            "head_before": {"branch": start.branch, "commit": start.commit},
            "target": target,
            "paths": repo.git("diff", "--name-only", "-z", start.commit, target).split("\0")[:-1],
            "phase": "switch",
        }
        if (start.branch, start.commit) != (branch, target):
            _switch(repo, journal)
        if not status.all_ok(results):
            _stop_at_conflict(repo, series, results, journal)
    return results


def _write_journal(repo: Repo, journal: dict) -> None:
    crashsafe.write_atomic(repo.git_dir / JOURNAL, json.dumps(journal, indent=1).encode())


def _switch(repo: Repo, journal: dict) -> None:
    """Set the branch, move index and work tree from the start commit to the target, point HEAD at
    the branch. On a git failure, put everything back and say why."""
    _write_journal(repo, journal)
    ref = f"refs/heads/{journal['branch']}"
    start = journal["head_before"]
    try:
        # First: a name git refuses (e.g. a branch "mtpq" blocks "mtpq/v0.22.1") fails here.
        before = journal["branch_before"] or NO_COMMIT
        created = repo.run("update-ref", "-m", "mtpq: the series", ref, journal["target"], before)
        if created.returncode != 0:
            raise TreeError(
                f"cannot create branch {journal['branch']} in {repo.root}: "
                f"{_text(created.stderr).strip()}; pass --branch NAME"
            )
        repo.git("read-tree", "-m", "-u", start["commit"], journal["target"])
        if start["branch"] != journal["branch"]:
            repo.git("symbolic-ref", "-m", "mtpq: switch to the series branch", "HEAD", ref)
    except TreeError as error:
        _roll_back(repo, journal)
        raise TreeError(f"{error} (nothing was changed)") from None
    (repo.git_dir / JOURNAL).unlink()


def _stop_at_conflict(repo: Repo, series: Series, results: list[PatchResult], journal: dict) -> None:
    """--rebase: run `git am` from the conflicting patch on, to stop there for the user to resolve.
    Killed while `git am` runs, the next run puts the tree back; once it stops, the conflict is the
    user's."""
    first = next(index for index, result in enumerate(results) if not result.ok)
    queue = series.patches[first:]
    paths = sorted(set(journal["paths"]) | set(series.files))
    _write_journal(repo, {**journal, "phase": "am", "paths": paths})
    done = repo.run(
        "am", "--3way", "--keep-non-patch", "--committer-date-is-author-date",
        env=_committer_env(repo), input=b"".join(patch.data for patch in queue),
    )  # fmt: skip
    if done.returncode != 0 and not (repo.git_dir / "rebase-apply").is_dir():
        _roll_back(repo, _read_journal(repo))
        raise TreeError(f"`git am` could not start in {repo.root}: {_text(done.stderr).strip()}")
    (repo.git_dir / JOURNAL).unlink()


def _recover(repo: Repo, journal: dict) -> None:
    """Put back what an interrupted run left, after making sure that it is all that run's doing."""
    foreign = _not_ours(repo, journal)
    if foreign:
        raise TreeError(
            f"an interrupted apply.py run (pid {journal['pid']}) left {repo.root} switching to branch "
            f"{journal['branch']}, and it was changed since: {', '.join(foreign[:10])}. Nothing was "
            f"changed. Save that work elsewhere, then run `git -C {repo.root} checkout -f "
            f"{journal['head_before']['branch'] or journal['head_before']['commit']}` and delete "
            f"{repo.git_dir / JOURNAL}."
        )
    _remove_stale_locks(repo, journal)
    _roll_back(repo, journal)
    print(
        f"put back what an interrupted apply.py run (pid {journal['pid']}) left in {repo.root}",
        flush=True,
    )


def _not_ours(repo: Repo, journal: dict) -> list[str]:
    """What in the tree an interrupted run cannot have left: a HEAD or branch it did not set, or a
    file it did not write (while switching, a file the series changes holds the start or the target
    version, whole or cut short; while `git am` ran, anything)."""
    start = journal["head_before"]
    branch = journal["branch"]
    head = repo.run("symbolic-ref", "--quiet", "--short", "HEAD")
    head_branch = _text(head.stdout).strip() if head.returncode == 0 else None
    foreign = []
    if head_branch not in (start["branch"], branch) or (
        head_branch is None and repo.commit_of("HEAD") != start["commit"]
    ):
        foreign.append("HEAD")
    now = repo.commit_of(f"refs/heads/{branch}")
    expected = {journal["branch_before"], journal["target"]}
    if now not in expected and not (journal["phase"] == "am" and _descends(repo, now, journal["target"])):
        foreign.append(f"branch {branch}")
    allowed = set(journal["paths"])
    for path in _changed_since(repo, start["commit"]):
        if path not in allowed:
            foreign.append(path)
        elif journal["phase"] == "switch" and not _partly_written(
            repo.root / path, [repo.blob(start["commit"], path), repo.blob(journal["target"], path)]
        ):
            foreign.append(path)
    return foreign


def _descends(repo: Repo, commit: str | None, ancestor: str) -> bool:
    return commit is not None and repo.run("merge-base", "--is-ancestor", ancestor, commit).returncode == 0


def _changed_since(repo: Repo, commit: str) -> list[str]:
    """Paths whose work-tree content differs from `commit` (untracked files included, ignored ones
    not), read from the files themselves rather than from an index that may be half written."""
    with _scratch_index(repo, commit) as env:
        repo.git("add", "--all", env=env)
        return repo.git("diff", "--cached", "--name-only", "-z", commit, env=env).split("\0")[:-1]


def _partly_written(path: Path, versions: list[bytes | None]) -> bool:
    """Whether the file is absent or a beginning of one of `versions` (git writes a file anew)."""
    if not path.exists():
        return True
    if not path.is_file() or path.is_symlink():
        return False
    content = path.read_bytes()
    return any(version is not None and version.startswith(content) for version in versions)


def _remove_stale_locks(repo: Repo, journal: dict) -> None:
    """The lock files and `git am` state that git commands of the interrupted run left: those that
    git commands of that run create, made since it began (its lock tells that it is gone)."""
    candidates = [
        repo.git_dir / "index.lock",
        repo.git_dir / "HEAD.lock",
        repo.git_dir / "ORIG_HEAD.lock",
        repo.common_dir / "packed-refs.lock",
        repo.common_dir / "refs" / "heads" / f"{journal['branch']}.lock",
    ]
    if journal["phase"] == "am":
        candidates.append(repo.git_dir / "rebase-apply")
    for path in candidates:
        try:
            made = path.lstat().st_mtime
        except FileNotFoundError:
            continue
        if made >= journal["time"] - 2:  # file systems with 2-second timestamps
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def _roll_back(repo: Repo, journal: dict) -> None:
    """HEAD, the branch, index and work tree as they were before the run. Every step can be
    repeated: killed here, the next run does it again."""
    start = journal["head_before"]
    ref = f"refs/heads/{journal['branch']}"
    if start["branch"] is not None:
        repo.git("symbolic-ref", "HEAD", f"refs/heads/{start['branch']}")
    else:
        repo.git("update-ref", "--no-deref", "HEAD", start["commit"])
    if journal["branch_before"] is not None:
        repo.git("update-ref", ref, journal["branch_before"])
    elif repo.commit_of(ref) is not None:
        repo.git("update-ref", "-d", ref)
    repo.git("reset", "--hard", "--quiet")
    # Files the series creates are untracked at the start commit: reset leaves those it never indexed.
    for path in journal["paths"]:
        if repo.blob(start["commit"], path) is None:
            _remove_with_empty_parents(repo.root, path)
    (repo.git_dir / JOURNAL).unlink(missing_ok=True)


def _remove_with_empty_parents(root: Path, relative: str) -> None:
    path = root / relative
    path.unlink(missing_ok=True)
    for parent in path.parents:
        if parent == root or any(parent.iterdir()):
            break
        parent.rmdir()


def export_series(repo: Repo, base: str | None, directory: Path) -> Series:
    """Rewrite `directory` (patch files and series) from the commits base..HEAD.

    A commit whose subject matches a patch already in the series keeps that file's name.
    """
    if base is None:
        base = repo.git("describe", "--tags", "--abbrev=0").strip()
    old = load_series(directory)
    if old.shared_patches:
        shared = ", ".join(str(patch.path.relative_to(directory.parent)) for patch in old.shared_patches)
        raise TreeError(
            f"{directory} lists patch files of another series ({shared}); exporting would rewrite "
            f"them. Export into a copy of the series that owns them, or into a new directory's copy."
        )
    old_by_subject = {patch.subject: patch.name for patch in old.patches}
    with scratch_dir("export") as scratch:
        exported = repo.git(
            "format-patch", "--no-signature", "--no-numbered", "--zero-commit", "--full-index",
            "-o", str(scratch), f"{base}..HEAD",
        ).splitlines()  # fmt: skip
        if not exported:
            raise TreeError(f"no commits between {base} and HEAD in {repo.root}; nothing to export")
        fresh = [parse_patch(Path(path)) for path in exported]
        return write_series(directory, {old_by_subject.get(p.subject, p.name): p.data for p in fresh})


def safe_extract(archive: tarfile.TarFile, destination: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(destination, filter="data")
        return
    for member in archive.getmembers():
        target = (destination / member.name).resolve()
        if not str(target).startswith(str(destination.resolve())) or member.issym() or member.islnk():
            raise TreeError(f"refusing unsafe sdist member {member.name}")
    archive.extractall(destination)


def sdist_tree(version: str, sdist: Artifact) -> Path:
    """A git repository of a release's sdist (tag v<version> on the baseline), built once and cached.
    It appears whole or not at all: it is built aside and renamed into place."""
    root = cache_root() / "src" / f"vllm-{version}"
    crashsafe.sweep_leftovers(root.parent, _UNPACKING)
    if (root / ".git").is_dir():
        return root
    archive_path = fetch(sdist)
    root.parent.mkdir(parents=True, exist_ok=True)
    with crashsafe.exclusive_lock(root.parent, f"building {root}"):
        if (root / ".git").is_dir():  # built by the run we waited for
            return root
        output.note(f"making a git tree of vLLM {version}'s sdist in {root} (once; a few hundred MB)")
        with crashsafe.private_path(root.parent, _UNPACKING, is_dir=True) as scratch:
            with tarfile.open(archive_path) as archive:
                safe_extract(archive, scratch)
            (unpacked,) = scratch.iterdir()
            _git(["init", "--quiet", "--initial-branch=main"], unpacked)
            repo = Repo(unpacked, unpacked / ".git", unpacked / ".git")
            repo.git("add", "--all", "--force")
            message = f"vLLM {version} (PyPI sdist, sha256 {sdist.sha256})"
            repo.git("commit", "--quiet", "--no-verify", "-m", message, env=MTPQ_IDENT)
            repo.git("tag", release_tag(version))
            unpacked.rename(root)
    return root


def pinned_tree(pin: Pin) -> Path:
    """The cached git repository of a pinned release's sdist."""
    return sdist_tree(pin.version, pin.artifacts["sdist"])
