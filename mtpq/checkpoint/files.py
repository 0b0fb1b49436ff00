"""Where a checkpoint's files are read from (CheckpointFiles): a local directory (LocalFiles) or a Hub
repository (hub.HubFiles), and their safetensors headers, read bounded and checked as patched vLLM's
parse_safetensors_file_metadata reads them (never tensor data). reader.py reads a checkpoint from them."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mtpq.checkpoint.survey import load_survey
from mtpq.core.errors import MtpqError

if TYPE_CHECKING:  # for a type hint alone: reader.py imports this module
    from mtpq.checkpoint.reader import Checkpoint

# The longest safetensors header read, as vLLM (series patch 0001) and the safetensors library allow.
MAX_HEADER_BYTES = 100_000_000
# An index or config is read whole: refuse one far larger than any real checkpoint's.
MAX_INDEX_BYTES = 64 * 2**20
# The dtypes the safetensors library (0.8) reads, as series patch 0001 lists them: it refuses a file
# naming another, so a tensor of another dtype cannot load.
SAFETENSORS_DTYPES = frozenset(
    "BOOL F4 F6_E2M3 F6_E3M2 U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ "
    "I16 U16 F16 BF16 I32 U32 F32 C64 F64 I64 U64".split()
)


class CheckpointError(MtpqError, ValueError):
    """Not a checkpoint directory, or a config / index / header that cannot be read."""


@dataclass(frozen=True)
class Header:
    path: str
    tensors: dict  # name -> the survey's TensorInfo
    bytes_read: int  # 8 + the header's length
    file_size: int


def check_header_length(where: str, length: int, file_size: int) -> None:
    """The 8-byte length a file declares, checked before its header is read."""
    if file_size < 8:
        raise CheckpointError(f"{where}: {file_size} bytes, too short for a safetensors header")
    if not 0 < length <= min(file_size - 8, MAX_HEADER_BYTES):
        raise CheckpointError(
            f"{where}: header length {length} does not fit a {file_size}-byte file "
            f"(at most {MAX_HEADER_BYTES})"
        )


def parse_header(where: str, raw: bytes, file_size: int) -> Header:
    """A header's JSON, each tensor entry checked as patched vLLM checks it (series patch 0001): a
    dtype the safetensors library reads, a shape of sizes and data_offsets [begin, end], all within
    the file (a shorter one is an incomplete download)."""
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{where}: header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: header is not a JSON object")
    data_end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not _is_tensor_entry(entry):
            raise CheckpointError(
                f"{where}: tensor {name!r:.200} has {entry!r:.200}, not a safetensors dtype, a shape "
                "and data_offsets [begin, end]"
            )
        data_end = max(data_end, entry["data_offsets"][1])
    if (declared := 8 + len(raw) + data_end) > file_size:
        raise CheckpointError(
            f"{where}: {file_size} bytes, shorter than the {declared} bytes its header declares "
            f"(data_offsets up to {data_end}): an incomplete download (download the file again)"
        )
    return Header(where, load_survey().tensor_infos(header), 8 + len(raw), file_size)


def _is_tensor_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    return (
        isinstance(entry.get("dtype"), str)
        and entry["dtype"] in SAFETENSORS_DTYPES
        and _are_sizes(shape)
        and _are_sizes(offsets)
        and len(offsets) == 2
        and offsets[0] <= offsets[1]
    )


def _are_sizes(value: object) -> bool:
    return isinstance(value, list) and all(type(size) is int and size >= 0 for size in value)  # no bool


class CheckpointFiles:
    """Where a checkpoint's files are read from: a local directory (LocalFiles) or a Hub repository
    (hub.HubFiles). Every method raises CheckpointError, one line naming the file."""

    name: str  # what messages call the checkpoint
    # Whether every shard's header is read (the index's coverage checked in full); False: only the
    # shards the index maps MTP tensors to, where each header costs a round trip.
    every_header = True

    def path(self, file: str) -> str:
        raise NotImplementedError

    def exists(self, file: str) -> bool:
        raise NotImplementedError

    def safetensors_files(self) -> list[str]:
        raise NotImplementedError

    def file_size(self, file: str) -> int:
        raise NotImplementedError

    def read_bytes(self, file: str, what: str) -> bytes:
        raise NotImplementedError

    def read_header(self, file: str) -> Header:
        raise NotImplementedError

    def data_spans(self, file: str) -> dict[str, tuple[int, int]]:
        """name -> (begin, end) file offsets of each tensor's data (after read_header validated it)."""
        raise NotImplementedError

    def read_range(self, file: str, begin: int, end: int) -> bytes:
        """Exactly the bytes [begin, end) of a file."""
        raise NotImplementedError

    def survey_at_start_up(self, survey, checkpoint: Checkpoint, num_mtp_layers: int) -> None:
        """What a series' start-up survey (its module) finds in the headers read: an index entry naming
        an absent file of MTP tensors, or no MTP tensor; raises the survey's errors."""
        layers = checkpoint.num_hidden_layers
        _, searched = load_survey().files_to_survey(
            self.name, self.safetensors_files(), checkpoint.index, layers, self.exists
        )
        survey.survey_mtp_tensors(checkpoint.tensors, layers, num_mtp_layers, where=self.surveyed(searched))

    def surveyed(self, searched: str) -> str:
        """How the series' survey names the checkpoint: a directory with the files it searched."""
        return searched


class LocalFiles(CheckpointFiles):
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.name = str(directory)

    def path(self, file: str) -> str:
        return str(self.directory / file)

    def exists(self, file: str) -> bool:
        return (self.directory / file).is_file()

    def safetensors_files(self) -> list[str]:
        return sorted(path.name for path in self.directory.glob("*.safetensors"))

    def file_size(self, file: str) -> int:
        return (self.directory / file).stat().st_size

    def read_bytes(self, file: str, what: str) -> bytes:
        try:
            return (self.directory / file).read_bytes()
        except OSError as error:
            raise CheckpointError(f"{self.path(file)}: unreadable {what} ({error})") from None

    def read_header(self, file: str) -> Header:
        path = self.path(file)
        try:
            # O_NONBLOCK: a FIFO is refused below, not waited on.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # a directory, FIFO or device
                os.close(fd)
                raise CheckpointError(f"{path}: not a regular file")
            with open(fd, "rb") as stream:
                length = int.from_bytes(stream.read(8), "little")
                check_header_length(path, length, info.st_size)
                return parse_header(path, stream.read(length), info.st_size)
        except OSError as error:
            raise CheckpointError(f"{path}: unreadable ({error})") from None

    def data_spans(self, file: str) -> dict[str, tuple[int, int]]:
        with open(self.directory / file, "rb") as stream:
            length = int.from_bytes(stream.read(8), "little")
            return spans_of(json.loads(stream.read(length)), 8 + length)

    def read_range(self, file: str, begin: int, end: int) -> bytes:
        with open(self.directory / file, "rb") as stream:
            stream.seek(begin)
            piece = stream.read(end - begin)
        if len(piece) != end - begin:
            raise CheckpointError(f"{self.path(file)}: ends before byte {end}")
        return piece


def spans_of(header: dict, data_start: int) -> dict[str, tuple[int, int]]:
    """name -> (begin, end) file offsets of each tensor's data, from a header's JSON."""
    return {
        name: (data_start + entry["data_offsets"][0], data_start + entry["data_offsets"][1])
        for name, entry in header.items()
        if name != "__metadata__"
    }
