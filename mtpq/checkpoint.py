"""A local checkpoint directory as vLLM sees it before loading a tensor: config files and safetensors
headers (through the survey's own bounded header reader), never tensor data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.survey import load_survey

CONFIG_FILE = "config.json"
# ModelOpt writes its quantization here; vLLM reads it when config.json has no quantization_config.
MODELOPT_CONFIG_FILE = "hf_quant_config.json"
# Where each quantization method keeps the modules it leaves unquantized.
IGNORE_FIELDS = ("ignore", "exclude_modules", "ignored_layers", "modules_to_not_convert")


class CheckpointError(ValueError):
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
class Checkpoint:
    directory: Path
    config: dict
    text_config: dict  # config["text_config"] for multimodal configs, else config itself
    quantization: dict | None  # quantization_config, or hf_quant_config.json's, with quant_method
    quantization_source: str | None
    tensors: dict  # name -> the survey's TensorInfo, from every header read
    tensor_files: dict[str, str]  # name -> the file holding it
    index: dict[str, str] | None  # the weight map, when there is an index
    coverage: Coverage
    header_files: tuple[str, ...]
    header_bytes: int  # bytes of headers read
    tensor_bytes: int  # bytes of tensor data in the files read (not read)
    config_bytes: int

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
        return self.header_bytes + self.tensor_bytes

    def ignore_entries(self) -> tuple[str | None, list]:
        """(field name, entries) of the quantization config's list of unquantized modules."""
        for name in IGNORE_FIELDS:
            if self.quantization and isinstance(self.quantization.get(name), list):
                return name, self.quantization[name]
        return None, []


def read_json(path: Path, what: str) -> tuple[object, int]:
    try:
        raw = path.read_bytes()
        return json.loads(raw), len(raw)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: unreadable {what} ({error})") from None


def read_config(directory: Path) -> tuple[dict, int]:
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a checkpoint directory (no such directory)")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory}: not a checkpoint directory (no {CONFIG_FILE})")
    config, size = read_json(path, "config")
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


def read_quantization(directory: Path, config: dict) -> tuple[dict | None, str | None, int]:
    for where, holder in (("config.json", config), ("config.json text_config", text_config_of(config))):
        if isinstance(holder.get("quantization_config"), dict):
            return holder["quantization_config"], f"{where} quantization_config", 0
    path = directory / MODELOPT_CONFIG_FILE
    if not path.is_file():
        return None, None, 0
    modelopt, size = read_json(path, "ModelOpt quantization config")
    quantization = modelopt.get("quantization") if isinstance(modelopt, dict) else None
    if not isinstance(quantization, dict):
        raise CheckpointError(f"{path}: no 'quantization' object")
    return {"quant_method": "modelopt", **quantization}, MODELOPT_CONFIG_FILE, size


def read_index(directory: Path) -> tuple[dict[str, str] | None, int | None, int]:
    survey = load_survey()
    path = directory / survey.INDEX_FILE
    if not path.exists():
        return None, None, 0
    index, size = read_json(path, "safetensors index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not (isinstance(weight_map, dict) and all(isinstance(file, str) for file in weight_map.values())):
        raise CheckpointError(f"{path}: weight_map is not an object of file names")
    total_size = (index.get("metadata") or {}).get("total_size")
    return weight_map, total_size if type(total_size) is int else None, size


def read_checkpoint(directory: Path) -> Checkpoint:
    """Config files and every header vLLM would read; a one-line CheckpointError when unusable."""
    survey = load_survey()
    directory = Path(directory)
    config, config_bytes = read_config(directory)
    quantization, quantization_source, modelopt_bytes = read_quantization(directory, config)
    weight_map, total_size, index_bytes = read_index(directory)
    present = sorted(path.name for path in directory.glob("*.safetensors"))
    coverage: dict = {}
    if weight_map is None:
        files = present
    else:
        by_file: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            by_file.setdefault(file, []).append(name)
        files = [file for file in sorted(by_file) if (directory / file).is_file()]
        coverage["missing_files"] = {
            file: sorted(names) for file, names in sorted(by_file.items()) if not (directory / file).is_file()
        }
        coverage["unindexed_files"] = [file for file in present if file not in by_file]
    tensors, tensor_files, holders = {}, {}, {}
    header_bytes = tensor_bytes = 0
    for file in files:
        try:
            header = survey.read_safetensors_header(directory / file)
        except survey.CheckpointHeaderError as error:
            raise CheckpointError(str(error)) from None
        header_bytes += header.bytes_read
        tensor_bytes += header.file_size - header.bytes_read
        for name, info in header.tensors.items():
            tensors[name] = info
            tensor_files.setdefault(name, file)
            holders.setdefault(name, []).append(file)
    coverage["duplicates"] = {name: where for name, where in holders.items() if len(where) > 1}
    if weight_map is not None:
        coverage["unmapped"] = sorted(name for name in tensors if name not in weight_map)
        read = set(files)
        coverage["misplaced"] = sorted(
            name for name, file in weight_map.items() if file in read and file not in holders.get(name, ())
        )
        if total_size is not None and total_size != tensor_bytes and not coverage["missing_files"]:
            coverage["total_size"] = (total_size, tensor_bytes)
    return Checkpoint(
        directory=directory,
        config=config,
        text_config=text_config_of(config),
        quantization=quantization,
        quantization_source=quantization_source,
        tensors=tensors,
        tensor_files=tensor_files,
        index=weight_map,
        coverage=Coverage(**coverage),
        header_files=tuple(files),
        header_bytes=header_bytes,
        tensor_bytes=tensor_bytes,
        config_bytes=config_bytes + modelopt_bytes + index_bytes,
    )
