"""A checkpoint as vLLM sees it before loading a tensor: config files and safetensors headers (read
through files.py, bounded and checked as patched vLLM's parse_safetensors_file_metadata reads them),
never tensor data; in a local directory, or on the Hub (mtpq.checkpoint.hub)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.checkpoint import hub
from mtpq.checkpoint.files import CheckpointError, CheckpointFiles, LocalFiles
from mtpq.checkpoint.survey import load_survey

CONFIG_FILE = "config.json"
# ModelOpt writes its quantization here; vLLM reads it when config.json has no quantization_config.
MODELOPT_CONFIG_FILE = "hf_quant_config.json"
# Where each quantization method keeps the modules it leaves unquantized.
IGNORE_FIELDS = ("ignore", "exclude_modules", "ignored_layers", "modules_to_not_convert")
# A JSON file beginning with a UTF-8 byte-order mark: transformers' and vLLM's readers refuse it.
UTF8_BOM = b"\xef\xbb\xbf"


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


def open_files(location: str | Path) -> CheckpointFiles:
    """A local directory, or a Hub repository id or URL (mtpq.checkpoint.hub, with huggingface_hub)."""
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
