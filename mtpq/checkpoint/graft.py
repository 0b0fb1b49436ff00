"""`python -m mtpq graft`: give a quantized checkpoint the MTP layers its quantizer dropped.

Quantizers load the model through a class without MTP modules, so the MTP tensors are not saved and
the MTP layer count leaves config.json. graft writes a new checkpoint: the quantized one (files
hard-linked), the BF16 release's MTP tensors copied tensor by tensor into one more file, an index
mapping every tensor, and the BF16 config's MTP fields. With --stock-vllm it also adds ignore
entries under the names that release's draft builds its modules with, where that alone makes stock
vLLM serve it, and says where it cannot. The doctor judges the result.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.checkpoint.doctor import WORKS, diagnose, stock_ignore_entries
from mtpq.checkpoint.files import CheckpointError, LocalFiles
from mtpq.checkpoint.reader import CONFIG_FILE, Checkpoint, read_checkpoint
from mtpq.checkpoint.survey import load_survey
from mtpq.core.errors import MtpqError

MTP_FILE = "model_mtp.safetensors"
# The model facts a grafted MTP layer must share with the quantized checkpoint.
SAME_MODEL_FIELDS = ("model_type", "hidden_size", "vocab_size", "num_hidden_layers")
_COPY_CHUNK = 64 * 2**20  # tensors are copied in pieces of at most this many bytes
EXIT_WRITTEN = 0
EXIT_STOCK_UNSERVED = 1  # written, but --stock-vllm's release cannot serve its MTP layers
_ITEM_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2, "F16": 2, "I16": 2}


class GraftError(MtpqError, ValueError):
    pass


@dataclass
class GraftResult:
    lines: list[str] = field(default_factory=list)
    stock_ok: bool | None = None  # with --stock-vllm: whether stock vLLM serves the result
    facts: dict = field(default_factory=dict)  # what --json prints: what was written, what is needed

    @property
    def exit_code(self) -> int:
        return EXIT_STOCK_UNSERVED if self.stock_ok is False else EXIT_WRITTEN


def graft(
    bf16: str | Path,
    quant_dir: Path,
    out: Path,
    stock_vllm: str | None = None,
    force: bool = False,
    copy_files: bool = False,
) -> GraftResult:
    """bf16: a local directory, or a Hub repository id or URL, of which only the MTP tensors' bytes
    (and the config files, the index and the headers of their shards) are read. copy_files: copy the
    quantized checkpoint's unchanged files instead of hard-linking them."""
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
    made: list[Path] = []
    scratch, written = None, False
    try:
        made = _make_parents(out)
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        unchanged = _carry_unchanged(quant, scratch, copy_files)
        mtp_file = MTP_FILE if not (quant.directory / MTP_FILE).exists() else f"grafted-{MTP_FILE}"
        mtp_bytes = _write_tensors(scratch / mtp_file, source, mtp)
        weight_map = {
            name: file for name, file in (quant.index or quant.tensor_files).items() if name not in stale
        }
        weight_map |= dict.fromkeys(mtp, mtp_file)
        index = {"metadata": {"total_size": quant.tensor_bytes + mtp_bytes}, "weight_map": weight_map}
        _write_json(scratch / survey.INDEX_FILE, index)
        _write_json(scratch / CONFIG_FILE, config)
        carried = (
            f"{unchanged} file(s) copied from {quant.directory}"
            if copy_files
            else f"{unchanged} file(s) hard-linked from {quant.directory} (they share their data: editing "
            "one in place changes QUANT_CKPT too; --copy copies them)"
        )
        result.lines.append(
            f"wrote {out}: {len(mtp)} MTP tensors ({mtp_bytes} bytes) from {source.name} in {mtp_file}; "
            f"{carried}; new {CONFIG_FILE} and {survey.INDEX_FILE}"
        )
        result.lines.append(f"config: {', '.join(restored) or 'no MTP field missing'}")
        if stock_vllm:
            result.stock_ok = _serve_stock(scratch, config, stock_vllm, result.lines)
        verdicts = {
            version: {flavour: verdict.kind for flavour, verdict in by_flavour.items()}
            for version, by_flavour in diagnose(scratch).verdicts.items()
        }
        for version, kinds in verdicts.items():
            result.lines.append(
                f"doctor: vLLM {version}: stock {kinds['stock']}; with the series {kinds['patched']}"
            )
        needed = still_needed(verdicts, stock_vllm, result.stock_ok)
        result.lines.append(needed)
        _move_into_place(scratch, out, force)
        written = True
    except OSError as error:
        raise GraftError(f"writing {out} failed ({error}); nothing was written") from None
    except CheckpointError as error:
        raise GraftError(f"--mtp-from: {error}; nothing was written") from None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if not written:
            _remove_parents(made)
    result.facts = {
        "out": str(out),
        "mtp_file": mtp_file,
        "mtp_tensors": len(mtp),
        "mtp_bytes": mtp_bytes,
        "source": source.name,
        "unchanged_files": unchanged,
        "unchanged_files_are": "copies" if copy_files else "hard links",
        "config_restored": restored,
        "stock_vllm": stock_vllm and {"version": stock_vllm, "serves": result.stock_ok},
        "doctor": verdicts,
        "still_needed": needed,
        "exit_code": result.exit_code,
    }
    return result


def still_needed(verdicts: dict[str, dict[str, str]], stock_vllm: str | None, stock_ok: bool | None) -> str:
    """The last line: what the user needs before vLLM serves the grafted checkpoint's MTP layers."""
    if stock_ok:
        return f"ready: stock vLLM {stock_vllm} serves its MTP layers"
    stock = [version for version, kinds in verdicts.items() if kinds["stock"] == WORKS]
    patched = [version for version, kinds in verdicts.items() if kinds["patched"] == WORKS]
    if len(stock) == len(verdicts):
        return "ready: stock vLLM serves its MTP layers"
    if patched:
        stock_option = (
            "" if stock_vllm else "; or, for a stock release, graft again with --stock-vllm VERSION"
        )
        return (
            f"still needed: vLLM {', '.join(patched)} with the mtpq series (python apply.py --installed, "
            f"--wheel, or the images){stock_option}"
        )
    return "still needed: no vLLM serves it yet; mtpq doctor on it says why"


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
    if (blocking := _first_non_directory(out.parent)) is not None:
        raise GraftError(f"--out {out}: {blocking} is not a directory")
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


def _first_non_directory(directory: Path) -> Path | None:
    """The nearest of `directory` and its parents that exists, when it is not a directory."""
    for path in (directory, *directory.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def _make_parents(out: Path) -> list[Path]:
    """Create --out's missing parent directories; return them, deepest first."""
    missing = [path for path in (out.parent, *out.parent.parents) if not path.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_parents(made: list[Path]) -> None:
    for path in made:
        with contextlib.suppress(OSError):
            path.rmdir()


def _carry_unchanged(quant: Checkpoint, scratch: Path, copy_files: bool) -> int:
    """Hard-link (or copy: asked for, or across file systems) every file that stays as it is."""
    survey = load_survey()
    rewritten = {CONFIG_FILE, survey.INDEX_FILE}
    carry = shutil.copy2 if copy_files else _link_or_copy
    count = 0
    for path in sorted(quant.directory.iterdir()):
        if path.name in rewritten:
            continue
        if path.is_dir():
            shutil.copytree(path, scratch / path.name, copy_function=carry)
        else:
            carry(path, scratch / path.name)
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
    entries, why = stock_ignore_entries(diagnosis, diagnosis.releases[version])
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
