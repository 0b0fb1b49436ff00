"""`python -m mtpq graft`: give a quantized checkpoint the MTP layers its quantizer dropped.

Quantizers load the model through a class without MTP modules, so the MTP tensors are not saved and
the MTP layer count leaves config.json. graft writes a new checkpoint: the quantized one (files
hard-linked), the BF16 release's MTP tensors copied tensor by tensor into one more file, an index
mapping every tensor, and the BF16 config's MTP fields. With --stock-vllm it also adds ignore
entries under the names that release's draft builds its modules with, where that alone makes stock
vLLM serve it, and says where it cannot. The doctor judges the result.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.checkpoint.doctor import WORKS, diagnose, stock_ignore_entries
from mtpq.checkpoint.reader import CONFIG_FILE, Checkpoint, CheckpointError, LocalFiles, read_checkpoint
from mtpq.checkpoint.survey import load_survey

MTP_FILE = "model_mtp.safetensors"
# The model facts a grafted MTP layer must share with the quantized checkpoint.
SAME_MODEL_FIELDS = ("model_type", "hidden_size", "vocab_size", "num_hidden_layers")
_COPY_CHUNK = 64 * 2**20  # tensors are copied in pieces of at most this many bytes
_ITEM_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2, "F16": 2, "I16": 2}


class GraftError(ValueError):
    pass


@dataclass
class GraftResult:
    lines: list[str] = field(default_factory=list)
    stock_ok: bool | None = None  # with --stock-vllm: whether stock vLLM serves the result


def graft(
    bf16: str | Path, quant_dir: Path, out: Path, stock_vllm: str | None = None, force: bool = False
) -> GraftResult:
    """bf16: a local directory, or a Hub repository id or URL, of which only the MTP tensors' bytes
    (and the config files, the index and the headers of their shards) are read."""
    survey = load_survey()
    source = _read(bf16, "--mtp-from")
    quant = _read(Path(quant_dir), "QUANT_CKPT")
    out = Path(out)
    local_inputs = [checkpoint.directory for checkpoint in (source, quant) if _is_local(checkpoint)]
    _check_out(out, local_inputs, force)
    _check_same_model(source, quant)
    layers = quant.num_hidden_layers
    mtp = sorted(name for name in source.tensors if survey.is_mtp_tensor(name, layers))
    _check_source(source, mtp, layers)
    stale = _check_quantized(quant, layers)
    config = copy.deepcopy(quant.config)
    restored = restore_mtp_fields(source.config, config)

    result = GraftResult()
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        linked = _link_unchanged(quant, scratch)
        mtp_file = MTP_FILE if not (quant.directory / MTP_FILE).exists() else f"grafted-{MTP_FILE}"
        mtp_bytes = _write_tensors(scratch / mtp_file, source, mtp)
        weight_map = {
            name: file for name, file in (quant.index or quant.tensor_files).items() if name not in stale
        }
        weight_map |= dict.fromkeys(mtp, mtp_file)
        index = {"metadata": {"total_size": quant.tensor_bytes + mtp_bytes}, "weight_map": weight_map}
        _write_json(scratch / survey.INDEX_FILE, index)
        _write_json(scratch / CONFIG_FILE, config)
        result.lines.append(
            f"grafted {len(mtp)} MTP tensors ({mtp_bytes} bytes) from {source.name} into {mtp_file}; "
            f"{linked} file(s) hard-linked from {quant.directory}; new {CONFIG_FILE} and {survey.INDEX_FILE}"
        )
        result.lines.append(f"config: {', '.join(restored) or 'no MTP field missing'}")
        if stock_vllm:
            result.stock_ok = _serve_stock(scratch, config, stock_vllm, result.lines)
        diagnosis = diagnose(scratch)
        for version, verdicts in diagnosis.verdicts.items():
            stock, patched = verdicts["stock"].kind, verdicts["patched"].kind
            result.lines.append(f"doctor: vLLM {version}: stock {stock}; with the series {patched}")
        _move_into_place(scratch, out, force)
    except OSError as error:
        raise GraftError(f"writing {out} failed ({error}); nothing was written") from None
    except CheckpointError as error:
        raise GraftError(f"--mtp-from: {error}; nothing was written") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.lines.append(str(out))
    return result


def restore_mtp_fields(source: dict, target: dict) -> list[str]:
    """Copy the source config's MTP fields (names with "mtp" or "nextn", top level and text_config)
    that the target lacks; return them as `field = value`."""
    restored = []
    for prefix, source_part, target_part in (
        ("", source, target),
        ("text_config.", source.get("text_config"), target.get("text_config")),
    ):
        if not (isinstance(source_part, dict) and isinstance(target_part, dict)):
            continue
        for key, value in source_part.items():
            if ("mtp" in key or "nextn" in key) and key not in target_part:
                target_part[key] = value
                restored.append(f"{prefix}{key} = {value!r} restored")
    return restored


def _read(location: str | Path, role: str) -> Checkpoint:
    try:
        return read_checkpoint(location)
    except CheckpointError as error:
        raise GraftError(f"{role}: {error}") from None


def _is_local(checkpoint: Checkpoint) -> bool:
    return isinstance(checkpoint.files, LocalFiles)


def _check_out(out: Path, inputs: list[Path], force: bool) -> None:
    if not out.parent.is_dir():
        raise GraftError(f"--out {out}: its parent directory does not exist")
    resolved = out.resolve()
    for directory in inputs:
        given = directory.resolve()
        if resolved == given or resolved in given.parents or given in resolved.parents:
            raise GraftError(f"--out {out} overlaps the input {directory}; inputs are never modified")
    if out.exists() and not force:
        raise GraftError(f"--out {out} exists; --force replaces it")


def _check_same_model(source: Checkpoint, quant: Checkpoint) -> None:
    if source.architecture != quant.architecture:
        raise GraftError(
            f"--mtp-from {source.name}: architectures[0] is {source.architecture}, "
            f"QUANT_CKPT's is {quant.architecture}"
        )
    for name in SAME_MODEL_FIELDS:
        ours, theirs = source.text_config.get(name), quant.text_config.get(name)
        if ours != theirs:
            raise GraftError(f"--mtp-from {source.name}: {name} is {ours!r}, QUANT_CKPT's is {theirs!r}")


def _check_source(source: Checkpoint, mtp: list[str], layers: int) -> None:
    survey = load_survey()
    where = f"--mtp-from {source.name}"
    if missing := [file for file, names in source.coverage.missing_files.items() if names]:
        raise GraftError(f"{where}: its index names {missing[0]}, which is missing")
    if not mtp:
        raise GraftError(
            f"{where}: no MTP tensor (none named mtp.*, *.mtp_layers.*, model.layers.{layers}+.*)"
        )
    quantized = survey.survey_mtp_tensors(source.tensors, layers, 1).quantized
    if quantized:
        module, label = next(iter(quantized.items()))
        raise GraftError(f"{where}: its MTP tensors are quantized ({module}: {label}), not BF16")


def _check_quantized(quant: Checkpoint, layers: int) -> set[str]:
    """The index entries to drop (MTP tensors mapped to a missing file); refuse anything else amiss."""
    survey = load_survey()
    if present := [name for name in quant.tensors if survey.is_mtp_tensor(name, layers)]:
        raise GraftError(f"QUANT_CKPT {quant.directory} already holds MTP tensors (e.g. {present[0]})")
    stale = set()
    for file, names in quant.coverage.missing_files.items():
        if not all(survey.is_mtp_tensor(name, layers) for name in names):
            raise GraftError(f"QUANT_CKPT {quant.directory}: its index names {file}, which is missing")
        stale.update(names)
    return stale


def _link_unchanged(quant: Checkpoint, scratch: Path) -> int:
    """Hard-link (or copy, across file systems) every file that stays as it is."""
    survey = load_survey()
    rewritten = {CONFIG_FILE, survey.INDEX_FILE}
    count = 0
    for path in sorted(quant.directory.iterdir()):
        if path.name in rewritten:
            continue
        if path.is_dir():
            shutil.copytree(path, scratch / path.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(path, scratch / path.name)
        count += 1
    return count


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _write_tensors(path: Path, source: Checkpoint, names: list[str]) -> int:
    """Write a safetensors file of the named source tensors, copying each one's bytes in pieces:
    memory stays within one piece, whatever the tensors' sizes; a remote source is read by ranges, so
    nothing but these tensors' bytes is fetched. Returns the bytes of tensor data."""
    spans, wanted = {}, set(names)  # name -> (source file, begin, end) of its data
    for file in sorted({source.tensor_files[name] for name in names}):
        spans |= {
            name: (file, *span)
            for name, span in source.files.data_spans(file).items()
            if source.tensor_files.get(name) == file and name in wanted
        }
    # Largest items first, as safetensors writes them, so every tensor stays aligned to its item size.
    order = sorted(names, key=lambda name: (-_ITEM_BYTES.get(source.tensors[name].dtype, 1), name))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in order:
        _, begin, end = spans[name]
        info = source.tensors[name]
        header[name] = {
            "dtype": info.dtype,
            "shape": list(info.shape),
            "data_offsets": [offset, offset + end - begin],
        }
        offset += end - begin
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "xb") as out:
        out.write(len(encoded).to_bytes(8, "little") + encoded)
        for name in order:
            file, begin, end = spans[name]
            for start in range(begin, end, _COPY_CHUNK):
                out.write(source.files.read_range(file, start, min(end, start + _COPY_CHUNK)))
        out.flush()
        os.fsync(out.fileno())
    return offset


def _write_json(path: Path, value: dict) -> None:
    with open(path, "x") as file:
        file.write(json.dumps(value, indent=2) + "\n")
        file.flush()
        os.fsync(file.fileno())


def _serve_stock(scratch: Path, config: dict, version: str, lines: list[str]) -> bool:
    """Add the ignore entries stock vLLM `version` needs; say whether it then works."""
    diagnosis = diagnose(scratch, [version])
    if diagnosis.verdicts[version]["stock"].kind == WORKS:
        lines.append(f"stock vLLM {version}: works as it is")
        return True
    entries, why = stock_ignore_entries(diagnosis, version)
    if not entries:
        lines.append(f"stock vLLM {version} cannot serve its MTP: {why}; vLLM with the mtpq series can")
        return False
    quantization = config.get("quantization_config") or config["text_config"]["quantization_config"]
    quantization["ignore"] = [*quantization.get("ignore", []), *entries]
    (scratch / CONFIG_FILE).unlink()
    _write_json(scratch / CONFIG_FILE, config)
    verdict = diagnose(scratch, [version]).verdicts[version]["stock"]
    lines.append(
        f"stock vLLM {version}: {len(entries)} ignore entries added under the draft's names "
        f"({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}): {verdict.kind}"
    )
    return verdict.kind == WORKS


def _move_into_place(scratch: Path, out: Path, force: bool) -> None:
    """Rename the finished checkpoint to `out`; a replaced one is removed only after that worked."""
    if not out.exists():
        os.rename(scratch, out)
        return
    assert force
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.rename(out, old / out.name)
    try:
        os.rename(scratch, out)
    except OSError:
        os.rename(old / out.name, out)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
