"""Build a patched vLLM wheel from the official PyPI wheel: the Python files of the patched
tree replace the wheel's, nothing is compiled, and the same inputs give the same bytes."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import tempfile
import zipfile
from pathlib import Path

from mtpq import gittree, status
from mtpq.download import fetch
from mtpq.pin import Pin
from mtpq.series import Series


class WheelError(RuntimeError):
    pass


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def patched_files(pin: Pin, series: Series) -> dict[str, bytes | None]:
    """Path -> patched content (None: the series deletes it), from the series applied to the pinned tree."""
    tree = gittree.pinned_tree(pin)
    repo = gittree.open_repo(tree)
    gittree.reset_pinned_branch(repo, pin)
    results = gittree.apply_series(repo, series, pin.branch)
    if not status.all_ok(results):
        raise WheelError("the series does not apply to the pinned tree:\n" + status.format_table("", results))
    files = {}
    for relative in series.files:
        if relative.startswith("vllm/"):
            path = tree / relative
            files[relative] = path.read_bytes() if path.exists() else None
    return files


def _pristine_matches(pin: Pin, relative: str, data: bytes) -> bool:
    """Whether the official wheel's copy of a file is the sdist's (what the patches were made on)."""
    repo = gittree.open_repo(gittree.pinned_tree(pin))
    return (repo.commit(pin.tag).tree / relative).data_stream.read() == data


def build_wheel(pin: Pin, series: Series, arch: str, out_dir: Path) -> Path:
    base = fetch(pin.wheel(arch))  # an unknown arch raises here, before anything is written
    replacements = patched_files(pin, series)
    local_version = f"{pin.version}+mtpq.{series.series_id}"
    old_info = f"vllm-{pin.version}.dist-info"
    new_info = f"vllm-{local_version}.dist-info"
    target = out_dir / base.name.replace(f"vllm-{pin.version}-", f"vllm-{local_version}-")
    out_dir.mkdir(parents=True, exist_ok=True)
    record: list[tuple[str, str, str]] = []
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".wheel-", suffix=".part", delete=False) as part:
        part_path = Path(part.name)
    try:
        with zipfile.ZipFile(base) as source, zipfile.ZipFile(part_path, "w") as wheel:

            def write(info: zipfile.ZipInfo, name: str, data: bytes) -> None:
                entry = zipfile.ZipInfo(name, date_time=info.date_time)
                entry.external_attr, entry.compress_type = info.external_attr, info.compress_type
                wheel.writestr(entry, data)
                record.append((name, _record_hash(data), str(len(data))))

            record_info = None
            seen = set()
            for info in source.infolist():
                name = info.filename
                if name == f"{old_info}/RECORD":
                    record_info = info
                    continue
                data = source.read(info)
                if name in replacements:
                    seen.add(name)
                    if not _pristine_matches(pin, name, data):
                        raise WheelError(f"{base.name}: {name} differs from the sdist the patches target")
                    if replacements[name] is None:
                        continue
                    data = replacements[name]
                if name == f"{old_info}/METADATA":
                    data = _metadata(data, local_version, series)
                write(info, name.replace(old_info + "/", new_info + "/", 1), data)
            for name in sorted(set(replacements) - seen):  # files the series creates
                if replacements[name] is not None:
                    write(record_info, name, replacements[name])
            write(record_info, f"{new_info}/mtpq.json", _series_json(pin, series))
            record.append((f"{new_info}/RECORD", "", ""))
            wheel.writestr(
                zipfile.ZipInfo(f"{new_info}/RECORD", date_time=record_info.date_time), _csv(record)
            )
        part_path.chmod(0o644)
        part_path.replace(target)
    finally:
        part_path.unlink(missing_ok=True)
    return target


def _csv(rows: list[tuple[str, str, str]]) -> str:
    """RECORD is CSV: some vLLM file names contain commas."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue()


def _metadata(data: bytes, local_version: str, series: Series) -> bytes:
    headers, _, description = data.decode().partition("\n\n")
    lines = [
        f"Version: {local_version}" if line.startswith("Version: ") else line for line in headers.splitlines()
    ]
    carried = "\n".join(f"- {patch.name}: {patch.subject}" for patch in series.patches)
    note = f"This build carries the mtpq patch series {series.series_id}:\n\n{carried}\n\n"
    return ("\n".join(lines) + "\n\n" + note + description).encode()


def _series_json(pin: Pin, series: Series) -> bytes:
    document = {
        "vllm_version": pin.version,
        "series_id": series.series_id,
        "patches": [{"name": patch.name, "subject": patch.subject} for patch in series.patches],
    }
    return (json.dumps(document, indent=1) + "\n").encode()
