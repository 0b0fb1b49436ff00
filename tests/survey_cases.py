"""Generated inputs for the header survey (vllm/transformers_utils/mtp_checkpoint.py) and the checks
each must pass: a result equal to what a plain json.loads reading means, or the module's own error
naming the file; never another exception, a hang, or unbounded memory. Used by
tests/test_mtp_checkpoint_properties.py (CI) and benchmarks/survey_fuzz.py (longer runs)."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from hypothesis import strategies as st
from vllm.transformers_utils import mtp_checkpoint
from vllm.transformers_utils import utils as vllm_utils

NUM_HIDDEN_LAYERS = 4
DTYPES = ["BF16", "F16", "F32", "F8_E4M3", "I8", "U8", "I32", "I64", "BOOL", "F8_E8M0"]
MODULE_ERRORS = (mtp_checkpoint.CheckpointHeaderError, mtp_checkpoint.MtpTensorsMissingError)


# The v0.22.1 series' survey reads headers with its own bounded parser; the newer series' with
# vLLM's parse_safetensors_file_metadata, which their patch 0001 bounds and checks.
OWN_PARSER = hasattr(mtp_checkpoint, "read_safetensors_header")
MAX_HEADER_BYTES = mtp_checkpoint.MAX_HEADER_BYTES if OWN_PARSER else vllm_utils.MAX_SAFETENSORS_HEADER_BYTES


def read_header(path: Path) -> dict[str, mtp_checkpoint.TensorInfo]:
    """The tensors of one file's header as the installed series' survey reads them; its
    CheckpointHeaderError naming the file otherwise."""
    if OWN_PARSER:
        return mtp_checkpoint.read_safetensors_header(path).tensors
    try:
        return mtp_checkpoint.tensor_infos(vllm_utils.parse_safetensors_file_metadata(path))
    except ValueError as error:
        raise mtp_checkpoint.CheckpointHeaderError(str(error)) from error


def header_file(path: Path, header: bytes, data_size: int) -> None:
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(data_size))


# --- what a header means, read with json.loads ------------------------------------------------


class Refused(Exception):
    pass


def _is_size_list(value: object, most: int) -> bool:
    return isinstance(value, list) and len(value) <= most and all(type(v) is int and v >= 0 for v in value)


def expected_tensors(text: str, data_size: int) -> dict[str, mtp_checkpoint.TensorInfo]:
    """The tensors a header holds, by the format's rules: a JSON object whose __metadata__ is null
    or strings by strings, every other member an object with a string dtype, a shape of non-negative
    integers and [begin, end] data_offsets within the data. The v0.22.1 series' own parser also
    bounds the shape to 64 sizes and an entry to a flat object (no "}" inside) of at most 64 KiB,
    and checks __metadata__. Raises Refused."""
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        raise Refused("not JSON") from None
    if not isinstance(header, dict):
        raise Refused("not an object")
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if (
                OWN_PARSER
                and entry is not None
                and not (
                    isinstance(entry, dict)
                    and len(entry) <= 2**16
                    and all(isinstance(value, str) for value in entry.values())
                )
            ):
                raise Refused("metadata")
            continue
        if not isinstance(entry, dict) or (
            OWN_PARSER and ("}" in json.dumps(entry)[:-1] or len(json.dumps(entry)) > 2**16)
        ):
            raise Refused("entry")
        offsets = entry.get("data_offsets")
        if not (
            isinstance(entry.get("dtype"), str)
            and _is_size_list(entry.get("shape"), 64 if OWN_PARSER else sys.maxsize)
            and _is_size_list(offsets, 2)
            and len(offsets) == 2
            and offsets[0] <= offsets[1] <= data_size
        ):
            raise Refused("fields")
        tensors[name] = mtp_checkpoint.TensorInfo(entry["dtype"], tuple(entry["shape"]))
    return tensors


def check_header(path: Path, header: bytes, data_size: int) -> None:
    """The module reads the header as `expected_tensors` does, or refuses it naming the file."""
    header_file(path, header, data_size)
    try:
        expected = expected_tensors(header.decode(), data_size)
    except (Refused, UnicodeDecodeError):
        expected = None
    try:
        found = read_header(path)
    except mtp_checkpoint.CheckpointHeaderError as error:
        assert str(path) in str(error), error
        assert expected is None, f"refused a valid header: {error}"
        return
    assert expected is not None, "accepted a malformed header"
    assert found == expected


def check_any_file(path: Path, data: bytes) -> None:
    """Any bytes: a header, or the module's error naming the file."""
    path.write_bytes(data)
    try:
        read_header(path)
    except mtp_checkpoint.CheckpointHeaderError as error:
        assert str(path) in str(error), error


# --- strategies --------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6,
)
NAME_PARTS = ["model", "layers", "mtp", "mtp_layers", "mlp", "experts", "weight", "language_model", "4", "12"]
# Corruptions of one field of an entry, and entries of other JSON types.
BROKEN_FIELDS = {
    "dtype": [7, None, ["BF16"]],
    "shape": [[-1, 2], [2.0], [True], [[2]], "2", list(range(65)), [10**30]],
    "data_offsets": [[8, 0], [0, 10**6], [0, 1, 2], [0], None, [-1, 0]],
    "extra": [{"nested": 1}, "a}b", [1, [2]]],
}
OTHER_ENTRIES = [[], "BF16", 3, None, True, {}]


def random_name(rng: random.Random) -> str:
    if rng.random() < 0.3:  # anything: escapes, quotes, braces, other scripts
        alphabet = 'ab.09"\\{}[]:,\x00\x7f\u00e9\u4e2d\U0001f600 '
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    parts = [rng.choice(NAME_PARTS) for _ in range(rng.randrange(1, 7))]
    if rng.random() < 0.05:
        parts.insert(1, "9" * rng.choice([20, 4301]))  # beyond what int() takes
    return ".".join(parts)


def random_entry(rng: random.Random, data_size: int) -> object:
    if rng.random() < 0.05:
        return rng.choice(OTHER_ENTRIES)
    begin = rng.randrange(data_size + 1)
    entry = {
        "dtype": rng.choice(DTYPES),
        "shape": [rng.choice([0, 1, 7, 2048, 2**40]) for _ in range(rng.randrange(5))],
        "data_offsets": [begin, rng.randrange(begin, data_size + 1)],
    }
    if rng.random() < 0.15:
        field = rng.choice(list(BROKEN_FIELDS))
        entry[field] = rng.choice(BROKEN_FIELDS[field])
    if rng.random() < 0.3:  # any key order
        entry = dict(rng.sample(list(entry.items()), len(entry)))
    return entry


def random_header(rng: random.Random) -> tuple[bytes, int]:
    """A header of random tensors, valid or with a field broken, in a random spelling; its data size."""
    data_size = rng.randrange(4096)
    header = {random_name(rng): random_entry(rng, data_size) for _ in range(rng.randrange(9))}
    if rng.random() < 0.3:
        header["__metadata__"] = rng.choice([None, {"format": "pt"}, {"a": 1}, ["pt"], {"k": "}"}])
    return dump(header, rng.randrange(4)), data_size


def mutate(rng: random.Random, data: bytes) -> bytes:
    """A few bytes changed, inserted or removed."""
    data = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        where = rng.randrange(len(data) + 1)
        byte = rng.choice(b'{}[]",:0 \\-e.tnfu\x00\xff') if rng.random() < 0.7 else rng.randrange(256)
        kind = rng.choice(["change", "insert", "delete"])
        if kind == "insert" or where == len(data):
            data.insert(where, byte)
        elif kind == "change":
            data[where] = byte
        else:
            del data[where]
    return bytes(data)


# Hypothesis draws the seed; a plain generator builds the input from it (far cheaper than composite
# strategies, so CI affords thousands).
randoms = st.randoms(use_true_random=False)
headers = randoms.map(random_header)
mutated_headers = randoms.map(lambda rng: (mutate(rng, (header := random_header(rng))[0]), header[1]))
names = st.one_of(st.text(max_size=20), randoms.map(random_name))


def dump(value: object, style: int) -> bytes:
    """JSON text in one of the spellings writers use: safetensors' compact one, Python's default,
    indented, and non-ASCII kept."""
    if style == 0:
        return json.dumps(value, separators=(",", ":")).encode()
    if style == 1:
        return json.dumps(value).encode()
    if style == 2:
        return json.dumps(value, indent=2).encode()
    return json.dumps(value, ensure_ascii=False, separators=(", ", " : ")).encode()


any_json_headers = st.tuples(json_values.map(lambda value: json.dumps(value).encode()), st.integers(0, 64))


# --- MTP tensor names --------------------------------------------------------------------------


def reference_mtp_root(name: str, num_hidden_layers: int) -> str | None:
    """The meaning of an MTP root, spelled the plain way (split; int() without a digit limit)."""
    import regex

    layer = regex.match(
        r"(?:model\.|model\.language_model\.|language_model\.model\.)layers\.([0-9]+)\.", name
    )
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        if layer and int(layer[1]) >= num_hidden_layers:
            return layer[0].removesuffix(".")
    finally:
        sys.set_int_max_str_digits(limit)
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part == "mtp" or part.startswith("mtp_"):
            digits = i + 2 < len(parts) and parts[i + 1].isascii() and parts[i + 1].isdecimal()
            return ".".join(parts[: i + 2 if digits else i + 1])
    return None


def check_name(name: str) -> None:
    assert mtp_checkpoint._mtp_root(name, NUM_HIDDEN_LAYERS) == reference_mtp_root(name, NUM_HIDDEN_LAYERS)


# --- checkpoint directories --------------------------------------------------------------------

file_names = st.sampled_from(
    [
        "model.safetensors",
        "model_mtp.safetensors",
        "",
        ".",
        "..",
        "a/b.safetensors",
        "x" * 300,
        "a\0b",
        "fifo.safetensors",
        "missing.safetensors",
    ]
)
mtp_names = st.sampled_from(
    [
        "mtp.0.e_proj.weight",
        "mtp.fc.weight",
        "model.layers.4.mlp.down_proj.weight",
        "model.layers." + "9" * 5000 + ".x.weight",
        "lm_head.weight",
    ]
)


@st.composite
def checkpoints(draw) -> dict:
    """A checkpoint directory: shard contents and an index, each valid, hostile or of the wrong kind."""
    shard = draw(st.one_of(headers, mutated_headers))
    index = draw(
        st.one_of(
            st.dictionaries(mtp_names, file_names, max_size=4).map(
                lambda weight_map: {"weight_map": weight_map}
            ),
            json_values,
            st.just(None),
        )
    )
    kind = draw(st.sampled_from(["json", "fifo", "directory", "dev-zero", "none"]))
    return {
        "shard": shard,
        "fifo_shard": draw(st.booleans()),
        "index": index,
        "index_kind": kind if index is not None else "none",
    }


def check_checkpoint(directory: Path, checkpoint: dict) -> None:
    """A survey, or the module's own errors; nothing blocks (the FIFOs have no writer)."""
    for entry in list(directory.iterdir()):
        entry.rmdir() if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    header, data_size = checkpoint["shard"]
    header_file(directory / "model.safetensors", header, data_size)
    if checkpoint["fifo_shard"]:
        os.mkfifo(directory / "fifo.safetensors")
    index = directory / mtp_checkpoint.INDEX_FILE
    kind = checkpoint["index_kind"]
    if kind == "json":
        index.write_text(json.dumps(checkpoint["index"]))
    elif kind == "fifo":
        os.mkfifo(index)
    elif kind == "directory":
        index.mkdir()
    elif kind == "dev-zero":
        index.symlink_to("/dev/zero")
    try:
        mtp_checkpoint.survey_mtp_checkpoint(directory, NUM_HIDDEN_LAYERS, 1)
    except MODULE_ERRORS as error:
        assert str(directory) in str(error) or mtp_checkpoint.INDEX_FILE in str(error), error
