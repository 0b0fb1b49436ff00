"""The patch series: patches/series (the table of contents) and the patch files it lists."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

DEP3_FIELDS = ("Origin", "Forwarded", "Bug", "Applied-Upstream", "Last-Update")
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_SIBLING_ENTRY = re.compile(r"\.\./[A-Za-z0-9._-]+/[A-Za-z0-9._-]+\.patch")
_HUNK_HEADER = re.compile(r"^@@ -", re.MULTILINE)


class SeriesError(ValueError):
    pass


@dataclass(frozen=True)
class Patch:
    path: Path
    subject: str
    author: str
    dep3: dict[str, str]
    files: tuple[str, ...]
    hunks: dict[str, int] = field(hash=False)  # file -> how many hunks change it

    @property
    def name(self) -> str:
        return self.path.name


def parse_patch(path: Path) -> Patch:
    """Parse a `git format-patch` file; raise SeriesError naming what is wrong."""
    try:
        text = path.read_text()
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
    body = message.partition("\n\n")[2].partition("\n---\n")[0]
    dep3 = {}
    for line in body.splitlines():
        field, sep, value = line.partition(":")
        if sep and field in DEP3_FIELDS:
            dep3[field] = value.strip()
    missing = [field for field in DEP3_FIELDS if not dep3.get(field)]
    if missing:
        raise SeriesError(f"{path.name}: DEP-3 field(s) missing from the message: {', '.join(missing)}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", dep3["Last-Update"]):
        raise SeriesError(f"{path.name}: Last-Update must be YYYY-MM-DD, got {dep3['Last-Update']!r}")
    sections = _DIFF_HEADER.split("diff --git " + diff)[1:]  # a, b, body, a, b, body, ...
    hunks = Counter()
    for target, body in zip(sections[1::3], sections[2::3], strict=True):
        hunks[target] += len(_HUNK_HEADER.findall(body))
    files = tuple(hunks)
    subject = " ".join(headers["Subject"].split())
    return Patch(
        path=path,
        subject=re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject),
        author=headers["From"],
        dep3=dep3,
        files=files,
        hunks=dict(hunks),
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
            digest.update(patch.name.encode() + b"\0" + patch.path.read_bytes() + b"\0")
        return "s" + digest.hexdigest()[:10]

    @property
    def shared_patches(self) -> tuple[Patch, ...]:
        """The patches it lists from a sibling series' directory."""
        return tuple(patch for patch in self.patches if patch.path.parent != self.directory)

    @property
    def files(self) -> tuple[str, ...]:
        """Every path the series touches, in first-touched order."""
        return tuple(dict.fromkeys(f for patch in self.patches for f in patch.files))


def load_series(directory: Path) -> Series:
    """Read `series`, check it against the directory, and parse every patch it lists.

    An entry is a patch file of the directory, or `../<series>/<file>`: a file of a sibling series
    (a release's series that is another's plus a patch lists the shared ones that way).
    """
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
