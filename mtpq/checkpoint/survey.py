"""The MTP header survey patched vLLM runs, loaded out of the patch that adds it.

The series adds `vllm/transformers_utils/mtp_checkpoint.py` (MTP tensor names, their on-disk formats,
the files to read, the draft's quantization decision). The doctor and graft run that very file: its
source is the `+` lines of the new-file patch with the hunks of the series' later patches to it
applied, executed as a module, so there is one copy of the classification and the doctor judges a
checkpoint exactly as patched vLLM does, from the headers it reads itself (mtpq.checkpoint.files).
Finding MTP tensors is the newest series' module; the draft's quantization decision, which the series
differ on, is taken from the module of the series serving the release judged (`series_survey`).

It needs neither vLLM (imported there only inside the functions that read files, which the doctor
does not call) nor the third-party `regex` package, which vLLM's lint requires in place of `re`: its
`import regex` is served by the standard library's `re`, which accepts the module's patterns.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from mtpq.core.errors import MtpqError
from mtpq.core.pin import newest_pin
from mtpq.core.series import SeriesError, load_series

SURVEY_PATH = "vllm/transformers_utils/mtp_checkpoint.py"
MODULE_NAME = "mtpq._vllm_mtp_checkpoint"
_NEW_FILE_HUNK = re.compile(r"^@@ -0,0 \+1(?:,(\d+))? @@", re.MULTILINE)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@.*$", re.MULTILINE)
_NO_NEWLINE = "\\ No newline at end of file"


class SurveyLoadError(MtpqError, ValueError):
    """The patch holding the survey is missing or damaged."""


def survey_patches(series_dir: Path | None = None) -> tuple[Path, ...]:
    """The patches of the (newest) series to the survey module: the one adding it, then the rest."""
    directory = series_dir or newest_pin().series_dir
    try:
        series = load_series(directory)
    except SeriesError as error:
        raise SurveyLoadError(f"cannot load the MTP survey: {error}") from None
    touching = tuple(patch.path.resolve() for patch in series.patches if SURVEY_PATH in patch.files)
    if not touching:
        raise SurveyLoadError(f"cannot load the MTP survey: no patch in {directory} adds {SURVEY_PATH}")
    return touching


def survey_patch(series_dir: Path | None = None) -> Path:
    """The patch of the (newest) series that adds the survey module."""
    return survey_patches(series_dir)[0]


def module_source(patch: Path) -> str:
    """The file a new-file patch creates: its hunk's `+` lines, checked against the hunk's length."""
    where = f"cannot load the MTP survey from {patch}"
    try:
        text = patch.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SurveyLoadError(f"{where}: {error}") from None
    diff_header = f"diff --git a/{SURVEY_PATH} b/{SURVEY_PATH}\nnew file mode"
    start = text.find(diff_header)
    hunk = _NEW_FILE_HUNK.search(text, start) if start >= 0 else None
    if hunk is None:
        raise SurveyLoadError(f"{where}: no new-file hunk for {SURVEY_PATH}")
    length = int(hunk[1] or 1)
    lines = text[hunk.end() :].split("\n")[1:]
    body = lines[:length]
    if len(body) < length or not all(line.startswith("+") for line in body):
        raise SurveyLoadError(f"{where}: the hunk promises {length} added lines and holds fewer")
    source = "\n".join(line[1:] for line in body)
    return source if lines[length : length + 1] == [_NO_NEWLINE] else source + "\n"


def with_hunks(source: str, patch: Path) -> str:
    """`source` with the patch's hunks to the survey module applied: exactly, no offset, no fuzz."""
    where = f"cannot load the MTP survey from {patch}"
    try:
        text = patch.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SurveyLoadError(f"{where}: {error}") from None
    start = text.find(f"diff --git a/{SURVEY_PATH} b/{SURVEY_PATH}\n")
    end = text.find("\ndiff --git ", start + 1)
    diff = text[start : end if end > 0 else len(text)].split("\n")
    lines, shift = source.splitlines(), 0
    for index, line in enumerate(diff):
        if not (hunk := _HUNK.match(line)):
            continue
        first, old_count, new_count = int(hunk[1]), int(hunk[2] or 1), int(hunk[3] or 1)
        old, new = [], []
        for row in diff[index + 1 :]:
            if len(old) == old_count and len(new) == new_count or row[:1] not in (" ", "-", "+", "\\"):
                break
            if row[:1] in (" ", "-"):
                old.append(row[1:])
            if row[:1] in (" ", "+"):
                new.append(row[1:])
        at = first - 1 + shift
        if len(old) != old_count or len(new) != new_count or lines[at : at + old_count] != old:
            raise SurveyLoadError(f"{where}: its hunk at line {first} does not apply to {SURVEY_PATH}")
        lines[at : at + old_count] = new
        shift += new_count - old_count
    return "\n".join(lines) + "\n"


def _import_with_stdlib_regex(name, *args, **kwargs):
    return re if name == "regex" else builtins.__import__(name, *args, **kwargs)


def load_survey(patch: Path | None = None) -> ModuleType:
    """The survey module the newest series leaves, or the one `patch` adds."""
    return _load((patch.resolve(),) if patch else survey_patches())


def series_survey(series_dir: Path) -> ModuleType:
    """The survey module of one series (a series that reuses another's patches gets the same module)."""
    return _load(survey_patches(series_dir))


def series_source(series_dir: Path | None = None) -> str:
    """The survey module's source as the (newest) series leaves it."""
    return _source(survey_patches(series_dir))


def _source(patches: tuple[Path, ...]) -> str:
    return functools.reduce(with_hunks, patches[1:], module_source(patches[0]))


@functools.cache
def _load(patches: tuple[Path, ...]) -> ModuleType:
    patch = patches[-1]
    source = _source(patches)
    # One module per series of patches: series differ (their draft quantization decisions do).
    name = f"{MODULE_NAME}_{hashlib.sha256(str(patches).encode()).hexdigest()[:12]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__file__ = f"{patch}:{SURVEY_PATH}"
    module.__builtins__ = {**vars(builtins), "__import__": _import_with_stdlib_regex}
    # dataclasses look their class's module up in sys.modules while the module executes.
    sys.modules[name] = module
    try:
        exec(compile(source, module.__file__, "exec"), vars(module))
    except Exception as error:
        del sys.modules[name]
        raise SurveyLoadError(
            f"cannot load the MTP survey from {patch}: {type(error).__name__}: {error}"
        ) from None
    return module
