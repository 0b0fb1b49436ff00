"""mtp_checkpoint: whether a checkpoint's MTP tensors are quantized, from safetensors headers alone."""

from __future__ import annotations

import json
import os
import re
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from vllm.transformers_utils import mtp_checkpoint

from tests.survey_cases import MAX_HEADER_BYTES, read_header

NUM_HIDDEN_LAYERS = 2
OUT, IN = 16, 64  # every synthetic Linear is IN -> OUT


def fp8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape).to(torch.float8_e4m3fn)


# format id -> (label the detector must report, the tensors one quantized Linear has on disk).
QUANT_FORMATS = {
    "ct-pack-quantized": (
        "compressed-tensors pack-quantized",
        lambda: {
            "weight_packed": torch.zeros(OUT, IN // 8, dtype=torch.int32),
            "weight_scale": torch.ones(OUT, IN // 32, dtype=torch.bfloat16),
            "weight_shape": torch.tensor([OUT, IN]),
            "weight_zero_point": torch.zeros(OUT // 8, IN // 32, dtype=torch.int32),
        },
    ),
    "ct-fp8": (
        "FP8 (compressed-tensors/ModelOpt)",
        lambda: {"weight": fp8(OUT, IN), "weight_scale": torch.ones(OUT, 1), "input_scale": torch.ones(1)},
    ),
    "ct-int8-w8a8": (
        "compressed-tensors INT8",
        lambda: {"weight": torch.zeros(OUT, IN, dtype=torch.int8), "weight_scale": torch.ones(OUT, 1)},
    ),
    "ct-nvfp4": (
        "compressed-tensors NVFP4",
        lambda: {
            "weight_packed": torch.zeros(OUT, IN // 2, dtype=torch.uint8),
            "weight_scale": fp8(OUT, IN // 16),
            "weight_global_scale": torch.ones(1),
        },
    ),
    "modelopt-nvfp4": (
        "ModelOpt NVFP4",
        lambda: {
            "weight": torch.zeros(OUT, IN // 2, dtype=torch.uint8),
            "weight_scale": fp8(OUT, IN // 16),
            "weight_scale_2": torch.ones(()),
            "input_scale": torch.ones(()),
        },
    ),
    "gptq-awq": (
        "GPTQ/AWQ",
        lambda: {
            "qweight": torch.zeros(IN // 8, OUT, dtype=torch.int32),
            "qzeros": torch.zeros(1, OUT // 8, dtype=torch.int32),
            "scales": torch.ones(1, OUT, dtype=torch.float16),
            "g_idx": torch.zeros(IN, dtype=torch.int32),
        },
    ),
    "fp8-block": (
        "FP8 block (weight_scale_inv)",
        lambda: {"weight": fp8(OUT, IN), "weight_scale_inv": torch.ones(1, 1)},
    ),
    "dsv4-raw": (
        "DeepSeek-V4 raw FP8/FP4 (.scale)",
        lambda: {"weight": fp8(OUT, IN), "scale": torch.ones(OUT, IN // 128 + 1).to(torch.float8_e8m0fnu)},
    ),
}
BF16 = "bf16"


def linear(module: str, fmt: str) -> dict[str, torch.Tensor]:
    if fmt == BF16:
        return {f"{module}.weight": torch.zeros(OUT, IN, dtype=torch.bfloat16)}
    return {f"{module}.{leaf}": tensor for leaf, tensor in QUANT_FORMATS[fmt][1]().items()}


@dataclass(frozen=True)
class MtpLayout:
    """Where one model family stores its MTP layer, for a main model of NUM_HIDDEN_LAYERS layers."""

    root: str  # the MTP layer root the survey reports
    glue: tuple[str, ...]  # the MTP layer's own Linear modules
    block: tuple[str, ...]  # Linear modules of the reused decoder block
    exempt: tuple[str, ...]  # 2-D BF16 modules that never count (embeddings, heads, routers)
    norm: str  # a 1-D tensor, never counted either


LAYOUTS = {
    "dsv4-mtp.i": MtpLayout(
        root="mtp.0",
        glue=("mtp.0.e_proj", "mtp.0.h_proj"),
        block=("mtp.0.attn.wq_a", "mtp.0.ffn.experts.0.w1", "mtp.0.ffn.shared_experts.w2"),
        exempt=("mtp.0.ffn.gate", "mtp.0.head"),
        norm="mtp.0.enorm.weight",
    ),
    "qwen3.5-mtp": MtpLayout(
        root="mtp",
        glue=("mtp.fc",),
        block=("mtp.layers.0.mlp.experts.0.gate_proj", "mtp.layers.0.self_attn.q_proj"),
        exempt=("mtp.layers.0.mlp.gate", "mtp.layers.0.mlp.shared_expert_gate"),
        norm="mtp.pre_fc_norm_embedding.weight",
    ),
    "mimo-mtp_layers": MtpLayout(
        root="model.mtp_layers.0",
        glue=("model.mtp_layers.0.input_proj",),
        block=("model.mtp_layers.0.mlp.down_proj", "model.mtp_layers.0.self_attn.o_proj"),
        exempt=(),
        norm="model.mtp_layers.0.token_layernorm.weight",
    ),
    "deepseek-v3-layers.N": MtpLayout(
        root=f"model.layers.{NUM_HIDDEN_LAYERS}",
        glue=(f"model.layers.{NUM_HIDDEN_LAYERS}.eh_proj",),
        block=(
            f"model.layers.{NUM_HIDDEN_LAYERS}.mlp.experts.0.up_proj",
            f"model.layers.{NUM_HIDDEN_LAYERS}.self_attn.kv_a_proj_with_mqa",
        ),
        exempt=(
            f"model.layers.{NUM_HIDDEN_LAYERS}.embed_tokens",
            f"model.layers.{NUM_HIDDEN_LAYERS}.mlp.gate",
            f"model.layers.{NUM_HIDDEN_LAYERS}.shared_head.head",
        ),
        norm=f"model.layers.{NUM_HIDDEN_LAYERS}.enorm.weight",
    ),
}


def mtp_layer(layout: MtpLayout, glue_format: str, block_format: str) -> dict[str, torch.Tensor]:
    tensors = {layout.norm: torch.ones(IN, dtype=torch.bfloat16)}
    for module in layout.glue:
        tensors |= linear(module, glue_format)
    for module in layout.block:
        tensors |= linear(module, block_format)
    for module in layout.exempt:
        tensors |= linear(module, BF16)
    return tensors


def main_model(fmt: str) -> dict[str, torch.Tensor]:
    """The target's own tensors: quantized decoder layers, BF16 embeddings/head and a vision tower."""
    tensors = {
        "model.embed_tokens.weight": torch.zeros(OUT, IN, dtype=torch.bfloat16),
        "model.norm.weight": torch.ones(IN, dtype=torch.bfloat16),
        "lm_head.weight": torch.zeros(OUT, IN, dtype=torch.bfloat16),
    }
    for layer in range(NUM_HIDDEN_LAYERS):
        tensors |= linear(f"model.layers.{layer}.self_attn.q_proj", fmt)
    return tensors | linear(f"model.visual.layers.{NUM_HIDDEN_LAYERS + 3}.mlp.fc1", BF16)


@pytest.fixture
def write_checkpoint(tmp_path):
    """Write {name: tensor} as tmp_path/<filename>; return its path."""

    def write(tensors: dict[str, torch.Tensor], filename: str = "model.safetensors") -> Path:
        save_file(tensors, tmp_path / filename)
        return tmp_path / filename

    return write


@pytest.fixture
def survey(tmp_path):
    return lambda: mtp_checkpoint.survey_mtp_checkpoint(tmp_path, NUM_HIDDEN_LAYERS, num_mtp_layers=1)


def decide(found) -> tuple[str, str]:
    """(the draft's quantization, the log summary): "unquantized" / "target" for the whole draft; the
    v0.22.1 series' per-module split of MTP layer and decoder block as "target/unquantized"."""
    decision = mtp_checkpoint.decide_draft_quantization(found)
    if hasattr(decision, "quant_config"):
        return decision.quant_config, decision.summary
    choice = (
        decision.mtp_layer
        if decision.mtp_layer == decision.block
        else f"{decision.mtp_layer}/{decision.block}"
    )
    return choice, decision.summary


def header_bytes(path: Path) -> int:
    """8 + the header length the file declares, read independently of the detector."""
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


@pytest.mark.parametrize("layout_id", LAYOUTS)
@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_each_quantization_format_is_recognised_in_each_mtp_layout(write_checkpoint, survey, fmt, layout_id):
    layout = LAYOUTS[layout_id]
    label = QUANT_FORMATS[fmt][0]
    write_checkpoint(main_model(fmt) | mtp_layer(layout, fmt, fmt))

    found = survey()
    choice, summary = decide(found)

    assert found.quantized == {module: label for module in layout.glue + layout.block}
    assert found.unquantized == ()
    assert found.prefixes == (layout.root,)
    assert choice == "target"
    assert f"as {label} -> draft keeps the target's quantization (headers" in summary


@pytest.mark.parametrize("layout_id", LAYOUTS)
def test_bf16_mtp_layer_of_a_quantized_model_gives_an_unquantized_draft(write_checkpoint, survey, layout_id):
    layout = LAYOUTS[layout_id]
    write_checkpoint(main_model("ct-int8-w8a8") | mtp_layer(layout, BF16, BF16))

    found = survey()
    choice, summary = decide(found)

    assert found.quantized == {}
    assert found.unquantized == tuple(sorted(layout.glue + layout.block))
    assert choice == "unquantized"
    expected = (
        rf"MTP tensors {re.escape(layout.root)}\.\*: {len(found.unquantized)} unquantized, 0 quantized "
        r"-> draft unquantized \(headers: 1 file, \d+(\.\d)? (B|KiB) of \d+\.\d KiB read\)"
    )
    assert re.fullmatch(expected, summary), summary


@pytest.mark.parametrize("layout_id", LAYOUTS)
def test_quantized_glue_around_a_bf16_block_is_split_or_refused(write_checkpoint, survey, series, layout_id):
    """The v0.22.1 series builds such a layer per module; the v0.33.0 series builds the whole draft
    with one quantization config, so it refuses the layout, naming the modules of each kind."""
    layout = LAYOUTS[layout_id]
    write_checkpoint(main_model("fp8-block") | mtp_layer(layout, "fp8-block", BF16))

    found = survey()

    assert found.glue_quantized == list(layout.glue) and found.block_quantized == []
    assert found.block_unquantized == sorted(layout.block) and found.glue_unquantized == []
    glue = ", ".join(layout.glue)
    if series.directory.name == "v0.22.1":
        choice, summary = decide(found)
        assert choice == "target/unquantized"
        assert f"-> decoder block unquantized, {glue} keep the target's quantization" in summary
    else:
        with pytest.raises(ValueError) as refused:
            decide(found)
        assert f"MTP layer's {glue} quantized" in str(refused.value)
        assert all(module in str(refused.value) for module in layout.block[:5])


@pytest.mark.parametrize("layout_id", LAYOUTS)
def test_quantized_block_with_bf16_glue_and_router_keeps_the_target_quantization(
    write_checkpoint, survey, layout_id
):
    layout = LAYOUTS[layout_id]
    write_checkpoint(main_model("ct-int8-w8a8") | mtp_layer(layout, BF16, "ct-int8-w8a8"))

    found = survey()
    choice, summary = decide(found)

    assert found.block_quantized == sorted(layout.block)
    assert found.glue_unquantized == list(layout.glue)
    assert choice == "target"
    assert f"draft keeps the target's quantization; unquantized: {', '.join(layout.glue)} (" in summary
    assert not [module for module in layout.exempt if module in summary]


def test_summary_names_at_most_five_unquantized_modules(write_checkpoint, survey):
    layout = LAYOUTS["mimo-mtp_layers"]
    extra_glue = [f"{layout.root}.proj_{index}" for index in range(7)]
    tensors = mtp_layer(layout, BF16, "ct-fp8")
    for module in extra_glue:
        tensors |= linear(module, BF16)
    write_checkpoint(tensors)

    found = survey()
    _, summary = decide(found)

    listed = sorted([*layout.glue, *extra_glue])
    assert f"unquantized: {', '.join(listed[:5])} (+{len(listed) - 5} more)" in summary
    assert not [module for module in listed[5:] if module in summary]


def test_sharded_checkpoint_reads_only_the_header_of_the_mtp_file(tmp_path, write_checkpoint, survey):
    layout = LAYOUTS["deepseek-v3-layers.N"]
    shards = {
        "model-00001-of-00002.safetensors": main_model("fp8-block"),
        "model-00002-of-00002.safetensors": linear("model.layers.1.mlp.down_proj", "fp8-block"),
        "model_mtp.safetensors": mtp_layer(layout, BF16, BF16),
    }
    paths = {filename: write_checkpoint(tensors, filename) for filename, tensors in shards.items()}
    weight_map = {name: filename for filename, tensors in shards.items() for name in tensors}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    found = survey()

    mtp_file = paths["model_mtp.safetensors"]
    assert found.files == (str(mtp_file),)
    assert found.bytes_read == header_bytes(mtp_file)
    assert found.checkpoint_bytes == sum(path.stat().st_size for path in paths.values())
    assert found.unquantized == tuple(sorted(layout.glue + layout.block))


def test_index_naming_an_absent_mtp_file_is_reported(tmp_path, write_checkpoint, survey):
    write_checkpoint(main_model("ct-fp8"))
    mtp_names = list(mtp_layer(LAYOUTS["mimo-mtp_layers"], BF16, BF16))
    weight_map = dict.fromkeys(main_model("ct-fp8"), "model.safetensors") | dict.fromkeys(
        mtp_names, "model_mtp.safetensors"
    )
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    with pytest.raises(mtp_checkpoint.MtpTensorsMissingError) as raised:
        survey()

    message = str(raised.value)
    assert "model_mtp.safetensors" in message and str(tmp_path) in message
    assert [name for name in mtp_names if name in message]


@pytest.mark.parametrize("indexed", [False, True], ids=["single-file", "indexed"])
def test_checkpoint_without_mtp_tensors_is_reported(tmp_path, write_checkpoint, survey, indexed):
    tensors = main_model("ct-int8-w8a8")
    write_checkpoint(tensors)
    if indexed:
        weight_map = dict.fromkeys(tensors, "model.safetensors")
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    with pytest.raises(mtp_checkpoint.MtpTensorsMissingError) as raised:
        survey()

    message = str(raised.value)
    assert "declares 1 MTP layer(s)" in message and f"model.layers.{NUM_HIDDEN_LAYERS}+" in message
    assert str(tmp_path) in message
    assert ("model.safetensors.index.json" if indexed else "searched: model.safetensors") in message


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mtp.0.e_proj.weight", True),
        ("mtp.layers.0.self_attn.q_proj.weight", True),
        ("mtp.fc.weight", True),
        ("model.mtp_layers.1.input_proj.weight", True),
        ("model.mtp_block.mlp.down_proj.weight", True),
        ("mtp_linear_proj.weight", True),
        (f"model.layers.{NUM_HIDDEN_LAYERS}.eh_proj.weight", True),
        (f"model.layers.{NUM_HIDDEN_LAYERS + 1}.mlp.gate_proj.weight", True),
        (f"model.language_model.layers.{NUM_HIDDEN_LAYERS}.mlp.gate_proj.weight", True),
        (f"language_model.model.layers.{NUM_HIDDEN_LAYERS}.mlp.gate_proj.weight", True),
        (f"model.layers.{NUM_HIDDEN_LAYERS - 1}.mlp.gate_proj.weight", False),
        (f"model.visual.layers.{NUM_HIDDEN_LAYERS + 5}.mlp.fc1.weight", False),
        (f"model.layers.{NUM_HIDDEN_LAYERS - 1}.mlp.experts.{NUM_HIDDEN_LAYERS + 5}.up_proj.weight", False),
        ("model.smtp.weight", False),
        ("model.embed_tokens.weight", False),
        ("lm_head.weight", False),
    ],
)
def test_mtp_tensor_names(name, expected):
    assert mtp_checkpoint.is_mtp_tensor(name, NUM_HIDDEN_LAYERS) is expected


def test_header_gives_dtypes_and_shapes_and_reads_only_the_header(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(
        {"big": torch.zeros(1024, 2048, dtype=torch.bfloat16), "scale": fp8(4)},
        path,
        metadata={"format": "pt"},
    )

    tensors = read_header(path)

    assert tensors == {
        "big": mtp_checkpoint.TensorInfo("BF16", (1024, 2048)),
        "scale": mtp_checkpoint.TensorInfo("F8_E4M3", (4,)),
    }


def test_survey_reads_under_a_thousandth_of_a_few_megabyte_checkpoint(write_checkpoint, survey):
    big_embedding = {"model.embed_tokens.weight": torch.zeros(2048, 1024, dtype=torch.bfloat16)}
    path = write_checkpoint(
        main_model("ct-fp8") | mtp_layer(LAYOUTS["dsv4-mtp.i"], BF16, BF16) | big_embedding
    )

    found = survey()

    assert found.bytes_read == header_bytes(path)
    assert found.checkpoint_bytes == path.stat().st_size > 4 * 2**20
    assert found.bytes_read < found.checkpoint_bytes / 1000


def raw_file(header: bytes, *, length: int | None = None, data: bytes = b"") -> bytes:
    return (len(header) if length is None else length).to_bytes(8, "little") + header + data


def json_file(header: object) -> bytes:
    return raw_file(json.dumps(header).encode(), data=bytes(8))


ENTRY = {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}
MALFORMED_FILES = {
    "shorter-than-8-bytes": b"\x02\x00\x00\x00",
    "zero-length": raw_file(b"", data=b"{}"),
    "length-past-end": raw_file(b"{}", length=1000),
    "not-json": raw_file(b"{not json"),
    "not-utf8": raw_file(b'{"\xff": 1}'),
    "deeply-nested-json": raw_file(b"[" * 200_000 + b"]" * 200_000),
    "json-array": json_file([ENTRY]),
    "entry-not-an-object": json_file({"w": [ENTRY]}),
    "dtype-not-a-string": json_file({"w": ENTRY | {"dtype": 7}}),
    "shape-not-integers": json_file({"w": ENTRY | {"shape": [2, "2"]}}),
    "shape-boolean": json_file({"w": ENTRY | {"shape": [True, 2]}}),
    "shape-negative": json_file({"w": ENTRY | {"shape": [-2, 2]}}),
    "offsets-missing": json_file({"w": {"dtype": "BF16", "shape": [2, 2]}}),
    "offsets-reversed": json_file({"w": ENTRY | {"data_offsets": [8, 0]}}),
    "offsets-past-data": json_file({"w": ENTRY | {"data_offsets": [0, 9]}}),
    "offsets-three-values": json_file({"w": ENTRY | {"data_offsets": [0, 4, 8]}}),
}


@pytest.mark.parametrize("case", MALFORMED_FILES)
def test_malformed_header_is_reported_with_the_file_name(tmp_path, case):
    path = tmp_path / "model.safetensors"
    path.write_bytes(MALFORMED_FILES[case])

    with pytest.raises(mtp_checkpoint.CheckpointHeaderError, match=re.escape(str(path))):
        read_header(path)


def test_survey_reports_a_malformed_file(tmp_path, write_checkpoint, survey):
    write_checkpoint(mtp_layer(LAYOUTS["dsv4-mtp.i"], BF16, BF16))
    broken = tmp_path / "model-extra.safetensors"
    broken.write_bytes(MALFORMED_FILES["json-array"])

    with pytest.raises(mtp_checkpoint.CheckpointHeaderError, match=re.escape(str(broken))):
        survey()


@pytest.mark.parametrize("make", [os.mkdir, os.mkfifo], ids=["directory", "fifo"])
def test_unreadable_file_is_reported_without_blocking(tmp_path, make):
    path = tmp_path / "x.safetensors"
    make(path)

    with pytest.raises(mtp_checkpoint.CheckpointHeaderError, match=re.escape(str(path))):
        read_header(path)


@pytest.mark.parametrize(
    ("declared_length", "file_size"),
    [(2**62, 64), (32 * 2**20, 64), (MAX_HEADER_BYTES + 1, MAX_HEADER_BYTES + 64)],
    ids=["length-2**62", "length-past-the-end-of-file", "length-over-the-limit"],
)
def test_bad_header_length_is_refused_before_allocating(tmp_path, declared_length, file_size):
    path = tmp_path / "model.safetensors"
    with open(path, "wb") as out:
        out.write(raw_file(b"{", length=declared_length))
        out.truncate(file_size)  # sparse: the data is a hole

    tracemalloc.start()
    try:
        with pytest.raises(mtp_checkpoint.CheckpointHeaderError, match=re.escape(str(path))):
            read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


@pytest.mark.parametrize(
    "index_text",
    ["{not json", json.dumps({"metadata": {}}), json.dumps({"weight_map": {"mtp.fc.weight": 3}})],
    ids=["not-json", "no-weight-map", "file-name-not-a-string"],
)
def test_malformed_index_is_reported(tmp_path, survey, index_text):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(index_text)

    with pytest.raises(mtp_checkpoint.CheckpointHeaderError, match=re.escape(str(index))):
        survey()
