"""Build a patched vLLM wheel from the official PyPI wheel: the Python files of the patched
tree replace the wheel's, nothing is compiled, and the same inputs give the same bytes.

Members the series leaves alone are copied as they are compressed in the official wheel, with their
RECORD rows (the wheel is sha256-pinned, so its RECORD is the published one); only the replaced files
and the metadata are compressed anew.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from mtpq.core import crashsafe, gittree, installed, status
from mtpq.core.download import fetch
from mtpq.core.errors import MtpqError
from mtpq.core.pin import Pin
from mtpq.core.series import Series

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_CENTRAL_HEADER = struct.Struct("<4s4B4HL2L5H2L")
_END_OF_CENTRAL_DIRECTORY = struct.Struct("<4s4H2LH")
_UTF8_NAME = 0x800
_ZIP32_LIMIT = 0xFFFFFFFF


class WheelError(MtpqError, RuntimeError):
    pass


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def patched_files(pin: Pin, series: Series) -> dict[str, bytes | None]:
    """Path -> patched content (None: the series deletes it), from the series committed on the pinned
    tree's baseline (in its object store: the managed tree's files and branches are not touched)."""
    repo = _pinned_repo(pin)
    results, commit = gittree.series_commit(repo, series, pin.tag)
    if not status.all_ok(results):
        raise WheelError("the series does not apply to the pinned tree:\n" + status.format_table("", results))
    return {relative: repo.blob(commit, relative) for relative in installed.package_files(series)}


def _pinned_repo(pin: Pin) -> gittree.Repo:
    return gittree.open_repo(gittree.pinned_tree(pin))


class _ZipWriter:
    """A deterministic zip writer (no zip64, no data descriptors) that can take a member's
    compressed bytes as they are."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.central: list[bytes] = []

    def add(self, name: str, like: zipfile.ZipInfo, data: bytes) -> None:
        """`data` compressed as `like` is, with its date and attributes."""
        if like.compress_type == zipfile.ZIP_DEFLATED:
            compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
            compressed = compressor.compress(data) + compressor.flush()
        elif like.compress_type == zipfile.ZIP_STORED:
            compressed = data
        else:
            raise WheelError(f"{name}: compression method {like.compress_type} is not supported")
        self.copy(name, like, compressed, zlib.crc32(data), len(data))

    def copy(self, name: str, like: zipfile.ZipInfo, compressed: bytes | _Span, crc: int, size: int) -> None:
        """A member whose compressed bytes are `compressed`, or lie in a span of another file."""
        offset = self.stream.tell()
        if max(offset, size, len(compressed)) > _ZIP32_LIMIT:
            raise WheelError(f"{name}: the wheel would need zip64, which this writer does not write")
        encoded, flags = (name.encode("ascii"), 0) if name.isascii() else (name.encode(), _UTF8_NAME)
        year, month, day, hour, minute, second = like.date_time
        dos_time = hour << 11 | minute << 5 | second // 2
        dos_date = (year - 1980) << 9 | month << 4 | day
        fields = (like.extract_version, 0, flags, like.compress_type, dos_time, dos_date, crc)
        sizes = (len(compressed), size, len(encoded))
        self.stream.write(_LOCAL_HEADER.pack(b"PK\x03\x04", *fields, *sizes, 0) + encoded)
        if isinstance(compressed, _Span):
            compressed.copy_to(self.stream)
        else:
            self.stream.write(compressed)
        self.central.append(
            _CENTRAL_HEADER.pack(
                b"PK\x01\x02", like.create_version, like.create_system, *fields, *sizes, 0, 0, 0,
                like.internal_attr, like.external_attr, offset,
            )
            + encoded
        )  # fmt: skip

    def finish(self) -> None:
        start = self.stream.tell()
        for entry in self.central:
            self.stream.write(entry)
        size = self.stream.tell() - start
        count = len(self.central)
        if count > 0xFFFF or start + size > _ZIP32_LIMIT:
            raise WheelError(f"{count} members: the wheel would need zip64, which this writer does not write")
        self.stream.write(_END_OF_CENTRAL_DIRECTORY.pack(b"PK\x05\x06", 0, 0, count, count, size, start, 0))


class _Span:
    """`length` bytes at `offset` of an open file, copied in the kernel where it can
    (copy_file_range), so that the unchanged members of a wheel never pass through Python."""

    def __init__(self, source: BinaryIO, offset: int, length: int, name: str) -> None:
        self.source, self.offset, self.length, self.name = source, offset, length, name

    def __len__(self) -> int:
        return self.length

    def copy_to(self, stream: BinaryIO) -> None:
        """Append the span to `stream` (a file opened for writing, at its end)."""
        stream.flush()
        offset, left = self.offset, self.length
        if hasattr(os, "copy_file_range"):  # Linux
            try:
                while left:
                    copied = os.copy_file_range(self.source.fileno(), stream.fileno(), left, offset)
                    if copied == 0:
                        break
                    offset, left = offset + copied, left - copied
            except OSError:
                pass  # a file system that cannot: the rest goes through Python
        stream.seek(0, os.SEEK_END)  # past what the kernel wrote
        if left:
            self.source.seek(offset)
            data = self.source.read(left)
            if len(data) != left:
                raise WheelError(f"{self.name}: truncated")
            stream.write(data)


def _compressed_span(raw: BinaryIO, info: zipfile.ZipInfo) -> _Span:
    """Where a member's data lies as stored: after its local header, whose name and extra field
    lengths may differ from the central directory's."""
    raw.seek(info.header_offset)
    header = raw.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise WheelError(f"{info.filename}: no local header where the central directory says")
    name_length, extra_length = struct.unpack("<2H", header[26:30])
    offset = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    return _Span(raw, offset, info.compress_size, info.filename)


def _official_record(source: zipfile.ZipFile, name: str) -> dict[str, tuple[str, str]]:
    rows = csv.reader(io.StringIO(source.read(name).decode()))
    return {row[0]: (row[1], row[2]) for row in rows if len(row) == 3}


def local_version(pin: Pin, series: Series) -> str:
    """The patched wheel's version: the release's, with the series as its local label."""
    return f"{pin.version}+mtpq.{series.series_id}"


def build_wheel(pin: Pin, series: Series, arch: str, out_dir: Path) -> Path:
    base = fetch(pin.wheel(arch))  # an unknown arch raises here, before anything is written
    replacements = patched_files(pin, series)
    repo = _pinned_repo(pin)
    version = local_version(pin, series)
    old_info = f"vllm-{pin.version}.dist-info"
    new_info = f"vllm-{version}.dist-info"
    target = out_dir / pin.wheel_name(arch, version)
    out_dir.mkdir(parents=True, exist_ok=True)
    record: list[tuple[str, str, str]] = []
    written: dict[str, bytes] = {}  # members compressed anew -> their content, to verify
    with crashsafe.private_path(out_dir, ".mtpq-wheel-", ".part") as part_path:
        with zipfile.ZipFile(base) as source, base.open("rb") as raw, part_path.open("wb") as stream:
            wheel = _ZipWriter(stream)
            record_info = source.getinfo(f"{old_info}/RECORD")
            official = _official_record(source, record_info.filename)

            def add(info: zipfile.ZipInfo, name: str, data: bytes) -> None:
                wheel.add(name, info, data)
                written[name] = data
                record.append((name, _record_hash(data), str(len(data))))

            for info in source.infolist():
                name = info.filename
                renamed = name.replace(old_info + "/", new_info + "/", 1)
                if info is record_info:
                    continue
                if name in replacements:
                    if source.read(info) != repo.blob(pin.tag, name):
                        raise WheelError(f"{base.name}: {name} differs from the sdist the patches target")
                    if replacements[name] is not None:
                        add(info, name, replacements[name])
                elif name == f"{old_info}/METADATA":
                    add(info, renamed, _metadata(source.read(info), version, series))
                elif name in official:
                    wheel.copy(renamed, info, _compressed_span(raw, info), info.CRC, info.file_size)
                    record.append((renamed, *official[name]))
                else:
                    raise WheelError(f"{base.name}: {name} is not in its RECORD")
            for name in sorted(set(replacements) - set(source.namelist())):  # files the series creates
                if replacements[name] is not None:
                    add(record_info, name, replacements[name])
            add(record_info, f"{new_info}/mtpq.json", _series_json(pin, series))
            record.append((f"{new_info}/RECORD", "", ""))
            wheel.add(f"{new_info}/RECORD", record_info, _csv(record).encode())
            wheel.finish()
        _verify(part_path, [row[0] for row in record], written)
        part_path.chmod(0o644)
        part_path.replace(target)
    return target


def _verify(path: Path, names: list[str], written: dict[str, bytes]) -> None:
    """The wheel reads back: every member in RECORD order, and those compressed anew intact (the
    copied ones are the official wheel's bytes)."""
    try:
        with zipfile.ZipFile(path) as wheel:
            if wheel.namelist() != names:
                raise WheelError(f"{path}: its members are not those its RECORD lists")
            for name, data in written.items():
                if wheel.read(name) != data:
                    raise WheelError(f"{path}: {name} does not read back")
    except zipfile.BadZipFile as error:
        raise WheelError(f"{path}: not a readable zip ({error})") from error


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
