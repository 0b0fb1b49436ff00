"""A checkpoint as vLLM sees it before loading a tensor: config files and safetensors headers (read
here, bounded and checked as patched vLLM's parse_safetensors_file_metadata reads them), never tensor
data; in a local directory, or on the Hub (mtpq.checkpoint.hub)."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.checkpoint.survey import load_survey
from mtpq.core.errors import MtpqError

CONFIG_FILE = "config.json"
# The longest safetensors header read, as vLLM (series patch 0000) and the safetensors library allow.
MAX_HEADER_BYTES = 100_000_000
# An index or config is read whole: refuse one far larger than any real checkpoint's.
MAX_INDEX_BYTES = 64 * 2**20
# ModelOpt writes its quantization here; vLLM reads it when config.json has no quantization_config.
MODELOPT_CONFIG_FILE = "hf_quant_config.json"
# Where each quantization method keeps the modules it leaves unquantized.
IGNORE_FIELDS = ("ignore", "exclude_modules", "ignored_layers", "modules_to_not_convert")
# The dtypes the safetensors library (0.8) reads, as series patch 0000 lists them: it refuses a file
# naming another, so a tensor of another dtype cannot load.
SAFETENSORS_DTYPES = frozenset(
    "BOOL F4 F6_E2M3 F6_E3M2 U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ "
    "I16 U16 F16 BF16 I32 U32 F32 C64 F64 I64 U64".split()
)
# A JSON file beginning with a UTF-8 byte-order mark: transformers' and vLLM's readers refuse it.
UTF8_BOM = b"\xef\xbb\xbf"


class CheckpointError(MtpqError, ValueError):
    """Not a checkpoint directory, or a config / index / header that cannot be read."""


@dataclass(frozen=True)
class Coverage:
    """How the files and model.safetensors.index.json agree (all empty: they do)."""

    duplicates: dict[str, list[str]] = field(default_factory=dict)  # tensor -> the files holding it
    missing_files: dict[str, list[str]] = field(default_factory=dict)  # file -> tensors it should hold
    unmapped: list[str] = field(default_factory=list)  # in a file's header, not in the weight map
    misplaced: list[str] = field(default_factory=list)  # mapped to a file whose header lacks it
    unindexed_files: list[str] = field(default_factory=list)  # present, named by no index entry
    total_size: tuple[int, int] | None = None  # (index metadata, the files' tensor bytes) when they differ

    @property
    def complete(self) -> bool:
        return not (
            self.duplicates or self.missing_files or self.unmapped or self.misplaced or self.total_size
        )


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
    """A header's JSON, each tensor entry checked as patched vLLM checks it (series patch 0000): a
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


@dataclass(frozen=True)
class Checkpoint:
    files: CheckpointFiles
    config: dict
    text_config: dict  # config["text_config"] for multimodal configs, else config itself
    quantization: dict | None  # quantization_config, or hf_quant_config.json's, with quant_method
    quantization_source: str | None
    tensors: dict  # name -> the survey's TensorInfo, from every header read
    tensor_files: dict[str, str]  # name -> the file holding it
    index: dict[str, str] | None  # the weight map, when there is an index
    coverage: Coverage
    header_files: tuple[str, ...]
    unread_files: tuple[str, ...]  # present, headers not read (files.every_header False): no MTP tensor
    header_bytes: int  # bytes of headers read
    tensor_bytes: int  # bytes of tensor data in the files read (not read)
    unread_bytes: int  # the sizes of unread_files
    config_bytes: int

    @property
    def name(self) -> str:
        return self.files.name

    @property
    def directory(self) -> Path:
        """A local checkpoint's directory (graft writes beside it and links its files)."""
        return self.files.directory

    @property
    def architecture(self) -> str:
        return self.config["architectures"][0]

    @property
    def num_hidden_layers(self) -> int:
        return self.text_config["num_hidden_layers"]

    @property
    def bytes_read(self) -> int:
        return self.header_bytes + self.config_bytes

    @property
    def checkpoint_bytes(self) -> int:
        return self.header_bytes + self.tensor_bytes + self.unread_bytes

    @property
    def tensor_names(self) -> set[str]:
        """Every tensor name known: the headers read, and the index's entries for unread files."""
        unread = set(self.unread_files)
        return set(self.tensors) | {name for name, file in (self.index or {}).items() if file in unread}

    def ignore_entries(self) -> tuple[str | None, list]:
        """(field name, entries) of the quantization config's list of unquantized modules."""
        for name in IGNORE_FIELDS:
            if self.quantization and isinstance(self.quantization.get(name), list):
                return name, self.quantization[name]
        return None, []


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


def open_files(location: str | Path) -> CheckpointFiles:
    """A local directory, or a Hub repository id or URL (mtpq.checkpoint.hub, with huggingface_hub)."""
    from mtpq.checkpoint import hub  # standard library alone until a remote checkpoint is named

    if not (isinstance(location, str) and hub.is_remote(location)):
        return LocalFiles(Path(location))
    if hub.is_url(location):
        return hub.HubFiles(location)
    # ORG/NAME that is no local path: a typo of one when ORG is a local directory.
    repo_id = location.partition("@")[0]
    parent = Path(repo_id).parent
    if parent.is_dir():
        beside = ", ".join(sorted(entry.name for entry in parent.iterdir())[:8]) or "nothing"
        raise CheckpointError(
            f"{location}: no such local directory ({parent} holds {beside}); to read the Hub "
            f"repository of that name, give its URL: https://huggingface.co/{repo_id}"
        )
    try:
        return hub.HubFiles(location)
    except hub.NotOnHub as error:
        raise CheckpointError(f"no local directory {location}, and as a Hub repository: {error}") from None


def read_json(files: CheckpointFiles, file: str, what: str) -> tuple[object, int]:
    """A JSON file as transformers and vLLM read it: UTF-8 text without a byte-order mark."""
    raw = files.read_bytes(file, what)
    path = files.path(file)
    if raw.startswith(UTF8_BOM):
        raise CheckpointError(
            f"{path}: the {what} begins with a UTF-8 byte-order mark (bytes EF BB BF), which transformers "
            "refuses (Unexpected UTF-8 BOM), so vLLM cannot start: save it without the mark, e.g. "
            f'python3 -c "import sys,pathlib; p=pathlib.Path(sys.argv[1]); '
            f"p.write_bytes(p.read_bytes()[3:])\" '{path}'"
        )
    try:
        return json.loads(raw.decode()), len(raw)
    except ValueError as error:
        raise CheckpointError(f"{path}: unreadable {what} ({error})") from None


def read_config(files: CheckpointFiles) -> tuple[dict, int]:
    if isinstance(files, LocalFiles) and not files.directory.is_dir():
        found = "a file" if files.directory.exists() else "no such directory"
        raise CheckpointError(f"{files.name}: not a checkpoint directory ({found})")
    if not files.exists(CONFIG_FILE):
        raise CheckpointError(f"{files.name}: not a checkpoint directory (no {CONFIG_FILE})")
    config, size = read_json(files, CONFIG_FILE, "config")
    path = files.path(CONFIG_FILE)
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    architectures = config.get("architectures")
    if not (isinstance(architectures, list) and architectures and isinstance(architectures[0], str)):
        raise CheckpointError(f"{path}: no architectures (the field names the model class vLLM builds)")
    text_config = text_config_of(config)
    if type(text_config.get("num_hidden_layers")) is not int:
        where = "text_config.num_hidden_layers" if text_config is not config else "num_hidden_layers"
        raise CheckpointError(f"{path}: no integer {where}")
    return config, size


def text_config_of(config: dict) -> dict:
    text_config = config.get("text_config")
    return text_config if isinstance(text_config, dict) else config


def read_quantization(files: CheckpointFiles, config: dict) -> tuple[dict | None, str | None, int]:
    for where, holder in (("config.json", config), ("config.json text_config", text_config_of(config))):
        found = holder.get("quantization_config")
        if isinstance(found, dict):
            return found, f"{where} quantization_config", 0
        if found is not None:  # vLLM calls .get() on it and fails
            raise CheckpointError(
                f"{files.path(CONFIG_FILE)}: quantization_config is {found!r:.80}, not an object, so "
                f"vLLM cannot read it ('{type(found).__name__}' object has no attribute 'get'): write the "
                'quantizer\'s object, e.g. {"quant_method": "fp8", ...}'
            )
    if not files.exists(MODELOPT_CONFIG_FILE):
        return None, None, 0
    modelopt, size = read_json(files, MODELOPT_CONFIG_FILE, "ModelOpt quantization config")
    quantization = modelopt.get("quantization") if isinstance(modelopt, dict) else None
    if not isinstance(quantization, dict):
        raise CheckpointError(f"{files.path(MODELOPT_CONFIG_FILE)}: no 'quantization' object")
    return {"quant_method": "modelopt", **quantization}, MODELOPT_CONFIG_FILE, size


def read_index(files: CheckpointFiles) -> tuple[dict[str, str] | None, int | None, int]:
    survey = load_survey()
    if not files.exists(survey.INDEX_FILE):
        return None, None, 0
    index, size = read_json(files, survey.INDEX_FILE, "safetensors index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not (isinstance(weight_map, dict) and all(isinstance(file, str) for file in weight_map.values())):
        raise CheckpointError(f"{files.path(survey.INDEX_FILE)}: weight_map is not an object of file names")
    total_size = (index.get("metadata") or {}).get("total_size")
    return weight_map, total_size if type(total_size) is int else None, size


def read_checkpoint(location: str | Path | CheckpointFiles) -> Checkpoint:
    """Config files and the headers vLLM would read (where files.every_header is False, only those of
    the shards the index maps MTP tensors to); a one-line CheckpointError when unusable."""
    survey = load_survey()
    files = location if isinstance(location, CheckpointFiles) else open_files(location)
    config, config_bytes = read_config(files)
    quantization, quantization_source, modelopt_bytes = read_quantization(files, config)
    weight_map, total_size, index_bytes = read_index(files)
    present = files.safetensors_files()
    coverage: dict = {}
    unread: list[str] = []
    if weight_map is None:
        names = present
    else:
        by_file: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            by_file.setdefault(file, []).append(name)
        names = [file for file in sorted(by_file) if files.exists(file)]
        coverage["missing_files"] = {
            file: sorted(tensors) for file, tensors in sorted(by_file.items()) if not files.exists(file)
        }
        coverage["unindexed_files"] = [file for file in present if file not in by_file]
        if not files.every_header:
            layers = text_config_of(config)["num_hidden_layers"]
            wanted = {file for name, file in weight_map.items() if survey.is_mtp_tensor(name, layers)}
            unread = [file for file in names if file not in wanted]
            names = [file for file in names if file in wanted]
    tensors, tensor_files, holders = {}, {}, {}
    header_bytes = tensor_bytes = 0
    for file in names:
        header = files.read_header(file)
        header_bytes += header.bytes_read
        tensor_bytes += header.file_size - header.bytes_read
        for name, info in header.tensors.items():
            tensors[name] = info
            tensor_files.setdefault(name, file)
            holders.setdefault(name, []).append(file)
    coverage["duplicates"] = {name: where for name, where in holders.items() if len(where) > 1}
    if weight_map is not None:
        coverage["unmapped"] = sorted(name for name in tensors if name not in weight_map)
        read = set(names)
        coverage["misplaced"] = sorted(
            name for name, file in weight_map.items() if file in read and file not in holders.get(name, ())
        )
        checkable = not coverage["missing_files"] and not unread
        if total_size is not None and total_size != tensor_bytes and checkable:
            coverage["total_size"] = (total_size, tensor_bytes)
    return Checkpoint(
        files=files,
        config=config,
        text_config=text_config_of(config),
        quantization=quantization,
        quantization_source=quantization_source,
        tensors=tensors,
        tensor_files=tensor_files,
        index=weight_map,
        coverage=Coverage(**coverage),
        header_files=tuple(names),
        unread_files=tuple(unread),
        header_bytes=header_bytes,
        tensor_bytes=tensor_bytes,
        unread_bytes=sum(files.file_size(file) for file in unread),
        config_bytes=config_bytes + modelopt_bytes + index_bytes,
    )
