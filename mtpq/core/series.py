"""The patch series: patches/series (the table of contents) and the patch files it lists."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from mtpq.core import crashsafe
from mtpq.core.errors import MtpqError

DEP3_FIELDS = ("Origin", "Forwarded", "Bug", "Applied-Upstream", "Last-Update")
# DEP-3 leaves Bug out where no bug report exists; the patch's description then says so.
DEP3_REQUIRED = tuple(field for field in DEP3_FIELDS if field != "Bug")
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_SIBLING_ENTRY = re.compile(r"\.\./[A-Za-z0-9._-]+/[A-Za-z0-9._-]+\.patch")
_HUNK_HEADER = re.compile(r"^@@ -", re.MULTILINE)


class SeriesError(MtpqError, ValueError):
    pass


@dataclass(frozen=True)
class Patch:
    path: Path
    subject: str
    author: str
    message: str  # the commit message after the subject line, up to `---`
    dep3: dict[str, str]
    files: tuple[str, ...]
    hunks: dict[str, int] = field(hash=False)  # file -> how many hunks change it
    # The file as read: what every run applies, so that a file changed or removed meanwhile
    # cannot make the series half of one version and half of another.
    data: bytes = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.path.name


def file_diffs(text: str) -> list[tuple[str, str]]:
    """(file it changes, its diff) of each `diff --git` section of a patch's text."""
    sections = _DIFF_HEADER.split(text)[1:]  # a, b, body, a, b, body, ...
    return list(zip(sections[1::3], sections[2::3], strict=True))


def parse_patch(path: Path) -> Patch:
    """Parse a `git format-patch` file; raise SeriesError naming what is wrong."""
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SeriesError(f"{path.name}: not a text patch") from None
    if not text.endswith("\n"):
        raise SeriesError(f"{path.name}: no newline at end of file")
    message, _, diff = text.partition("\ndiff --git ")
    if not diff:
        raise SeriesError(f"{path.name}: no 'diff --git' section")
    headers = HeaderParser().parsestr(message.partition("\n")[2] if message.startswith("From ") else message)
    if not headers["From"] or not headers["Subject"]:
        raise SeriesError(f"{path.name}: missing From:/Subject: (not git format-patch output?)")
    message_body = message.partition("\n\n")[2].partition("\n---\n")[0]
    dep3 = {}
    for line in message_body.splitlines():
        field, sep, value = line.partition(":")
        if sep and field in DEP3_FIELDS:
            dep3[field] = value.strip()
    missing = [field for field in DEP3_REQUIRED if not dep3.get(field)]
    if missing:
        raise SeriesError(f"{path.name}: DEP-3 field(s) missing from the message: {', '.join(missing)}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", dep3["Last-Update"]):
        raise SeriesError(f"{path.name}: Last-Update must be YYYY-MM-DD, got {dep3['Last-Update']!r}")
    hunks = Counter()
    for target, body in file_diffs("diff --git " + diff):
        hunks[target] += len(_HUNK_HEADER.findall(body))
    files = tuple(hunks)
    # Long headers are folded over lines (RFC 5322); a name or subject is one line.
    subject, author = (" ".join(headers[name].split()) for name in ("Subject", "From"))
    return Patch(
        path=path,
        subject=re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject),
        author=author,
        message=message_body,
        dep3=dep3,
        files=files,
        hunks=dict(hunks),
        data=data,
    )


@dataclass(frozen=True)
class Series:
    directory: Path
    patches: tuple[Patch, ...]

    @property
    def series_id(self) -> str:
        """Short content hash of the series: names a patched tree, wheel or image."""
        digest = hashlib.sha256()
        for patch in self.patches:
            digest.update(patch.name.encode() + b"\0" + patch.data + b"\0")
        return "s" + digest.hexdigest()[:10]

    @property
    def shared_patches(self) -> tuple[Patch, ...]:
        """The patches it lists from a sibling series' directory."""
        return tuple(patch for patch in self.patches if patch.path.parent != self.directory)

    @property
    def files(self) -> tuple[str, ...]:
        """Every path the series touches, in first-touched order."""
        return tuple(dict.fromkeys(f for patch in self.patches for f in patch.files))


# A new series that `--export` wrote completely, waiting to be moved in; and one being written.
_STAGED = ".mtpq-export"
_STAGING = ".mtpq-export.part"
_REMOVALS = ".remove"  # in _STAGED: the old patch files the new series no longer has


def load_series(directory: Path) -> Series:
    """Read `series`, check it against the directory, and parse every patch it lists.

    An entry is a patch file of the directory, or `../<series>/<file>`: a file of a sibling series
    (a release's series that is another's plus a patch lists the shared ones that way). A new series
    that an interrupted `--export` staged completely is moved in first; one it left half-staged goes.
    """
    if (directory / _STAGED).is_dir() or (directory / _STAGING).is_dir():
        with crashsafe.exclusive_lock(directory, f"the series in {directory}"):
            _move_staged_series_in(directory)
            # An export writes it holding the lock: one there now is a killed export's.
            shutil.rmtree(directory / _STAGING, ignore_errors=True)
    series_file = directory / "series"
    if not series_file.is_file():
        raise SeriesError(f"{series_file}: missing")
    names = [
        line.strip()
        for line in series_file.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SeriesError(f"{series_file}: listed more than once: {', '.join(duplicates)}")
    odd = [name for name in names if "/" in name and not _SIBLING_ENTRY.fullmatch(name)]
    if odd:
        raise SeriesError(f"{series_file}: entries must be FILE or ../SERIES/FILE, not: {', '.join(odd)}")
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise SeriesError(f"{series_file}: entries without a file: {', '.join(missing)}")
    unlisted = sorted(p.name for p in directory.glob("*.patch") if p.name not in names)
    if unlisted:
        raise SeriesError(f"{directory}: patch files not listed in series: {', '.join(unlisted)}")
    return Series(directory=directory, patches=tuple(parse_patch(directory / name) for name in names))


def write_series(directory: Path, patches: dict[str, bytes]) -> Series:
    """Replace the series in `directory` with `patches` (file name -> content, in series order),
    keeping the series file's comments and blank lines.

    The new files are staged completely in a hidden directory first, then moved in one by one; a run
    killed while moving leaves the staged rest, which the next load of the series moves in. A run
    killed while staging leaves the old series as it was.
    """
    with crashsafe.exclusive_lock(directory, f"the series in {directory}"):
        _move_staged_series_in(directory)  # an interrupted export's, before reading the series
        old = load_series(directory)
        staging = directory / _STAGING
        shutil.rmtree(staging, ignore_errors=True)  # an interrupted export's; the lock makes it ours
        staging.mkdir()
        for name, data in patches.items():
            (staging / name).write_bytes(data)
        series_file = directory / "series"
        (staging / "series").write_text(_series_file_text(series_file.read_text(), list(patches)))
        removed = [patch.name for patch in old.patches if patch.name not in patches]
        (staging / _REMOVALS).write_text("".join(f"{name}\n" for name in removed))
        staging.rename(directory / _STAGED)
        _move_staged_series_in(directory)
    return load_series(directory)


def _move_staged_series_in(directory: Path) -> None:
    """Finish moving a staged series in; every step can be repeated after a kill."""
    staged = directory / _STAGED
    if not staged.is_dir():
        return
    removals = staged / _REMOVALS
    removed = removals.read_text().split() if removals.exists() else []
    # The series file last: until it moves, the old one lists the old files, which are still there.
    for path in sorted(staged.iterdir(), key=lambda path: path.name == "series"):
        if path != removals:
            path.replace(directory / path.name)
    for name in removed:
        (directory / name).unlink(missing_ok=True)
    removals.unlink(missing_ok=True)
    staged.rmdir()


def _series_file_text(text: str, names: list[str]) -> str:
    """`text` with its entry lines filled with `names` in order, keeping comments and blank lines."""
    remaining = iter(names)
    lines = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            lines.append(line)
        elif (name := next(remaining, None)) is not None:
            lines.append(name)
    lines += list(remaining)
    return "\n".join(lines) + "\n"
