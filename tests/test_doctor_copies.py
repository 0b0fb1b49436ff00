"""The logic the doctor deliberately holds a second copy of, so that it reads checkpoints with the
standard library alone, checked against the original on the test bed: each copy fails here the day
it drifts.

- its safetensors header checks (mtpq/checkpoint/files.py) against patched vLLM's
  parse_safetensors_file_metadata (series patch 0001), and its dtypes against the safetensors library;
- its compressed-tensors ignore / target matching (mtpq/checkpoint/doctor.py) against vLLM's matcher;
- its words for vLLM's errors (mtpq/checkpoint/facts.py) against the messages in the patches.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtpq.checkpoint import doctor, facts, files, matching, schemes
from tests import header_checkpoints
from tests.conftest import ROOT, target_version
from tests.header_checkpoints import QUARK_FP8, QUARK_FP8_WEIGHT, QUARK_INT8, QUARK_INT8_WEIGHT, quark_entry
from tests.survey_cases import mutate, random_header

vllm_utils = pytest.importorskip("vllm.transformers_utils.utils")
with_patch_0000 = pytest.mark.skipif(
    not hasattr(vllm_utils, "SafetensorsHeaderError"),
    reason="this test bed's series reads headers with its own parser (no header-bounds patch)",
)

HOSTILE_ENTRIES = [
    {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]},
    {"dtype": "bf16", "shape": [1], "data_offsets": [0, 2]},
    {"dtype": "BF16", "shape": [1], "data_offsets": [0, 10**9]},  # past the end: a truncated file
    {"dtype": ["BF16"], "shape": [1], "data_offsets": [0, 2]},
]


def both_readers(path):
    """(doctor's outcome, vLLM's outcome): the tensors' dtypes read, or the error's words."""
    outcomes = []
    for read, error_type in (
        (lambda: files.LocalFiles(path.parent).read_header(path.name).tensors, files.CheckpointError),
        (lambda: vllm_utils.parse_safetensors_file_metadata(path), vllm_utils.SafetensorsHeaderError),
    ):
        try:
            found = read()
        except error_type as error:
            outcomes.append(("refused", str(error)))
        else:
            dtypes = {name: getattr(info, "dtype", info) for name, info in found.items()}
            outcomes.append(
                (
                    "read",
                    {
                        n: d["dtype"] if isinstance(d, dict) else d
                        for n, d in dtypes.items()
                        if n != "__metadata__"
                    },
                )
            )
    return outcomes


@with_patch_0000
def test_the_doctor_reads_and_refuses_headers_as_patched_vllm_does(tmp_path):
    rng = random.Random(33)
    path = tmp_path / "model.safetensors"
    cases = []
    for _ in range(400):
        header, data_size = random_header(rng)
        cases.append((header, data_size))
        cases.append((mutate(rng, header), data_size))
    for entry in HOSTILE_ENTRIES:
        cases.append((json.dumps({"w": entry}).encode(), 2))
    cases += [(b"{}", 0), (b"", 8), (b"[]", 0), (b'{"w": 1}', 0)]
    refused = 0
    for header, data_size in cases:
        path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(data_size))
        doctor_outcome, vllm_outcome = both_readers(path)
        assert doctor_outcome == vllm_outcome, header[:300]
        refused += doctor_outcome[0] == "refused"
    assert 0.1 < refused / len(cases) < 0.9  # both kinds were generated


@with_patch_0000
def test_the_doctor_and_vllm_know_the_dtypes_the_safetensors_library_reads(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    assert files.SAFETENSORS_DTYPES == vllm_utils.SAFETENSORS_DTYPES
    path = tmp_path / "model.safetensors"
    for dtype in sorted(files.SAFETENSORS_DTYPES) + ["Q9", "bf16", "I4", "F8"]:
        header = json.dumps({"w": {"dtype": dtype, "shape": [0], "data_offsets": [0, 0]}}).encode()
        path.write_bytes(len(header).to_bytes(8, "little") + header)
        try:
            with safetensors.safe_open(path, "np"):
                read = True
        except Exception:  # the library's SafetensorError (its type differs between versions)
            read = False
        assert read == (dtype in files.SAFETENSORS_DTYPES), dtype


# --- compressed-tensors matching ---------------------------------------------------------------------

INSTALLED = target_version()
ct_utils = pytest.importorskip("vllm.model_executor.layers.quantization.compressed_tensors.utils")
FUSED_MAPPING = {fused: list(shards) for fused, shards in schemes.FUSED_LINEARS}
LEAVES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "eh_proj", "q_a_proj"]
PREFIXES = ["model.layers.2", "model.mtp_layers.0", "mtp.layers.0", "model.layers.61.mtp_block"]
PARENTS = ["self_attn", "mlp", "mlp.shared_experts"]


def random_entry(rng: random.Random) -> str:
    name = f"{rng.choice(PREFIXES)}.{rng.choice(PARENTS)}.{rng.choice(LEAVES)}"
    kind = rng.randrange(4)
    if kind == 0:
        return name
    if kind == 1:
        return "re:" + re.escape(name).replace(re.escape(rng.choice(LEAVES)), ".*")
    if kind == 2:
        return f"re:.*{rng.choice(LEAVES)}$"
    return f"re:.*{rng.choice(PARENTS)}\\.{rng.choice(['q', 'k', 'gate', 'up'])}.*"


class Linear:  # what vLLM matches the class-name target "Linear" against, by containment
    pass


class QKVParallelLinear(Linear):
    pass


def test_ignore_and_targets_match_as_vllms_compressed_tensors_matcher_does():
    rng = random.Random(33)
    compared = {"ignored": 0, "mixed": 0, "targeted": 0}
    for _ in range(2000):
        entries = [random_entry(rng) for _ in range(rng.randrange(4))]
        targets = [random_entry(rng) for _ in range(rng.randrange(3))]
        shard = f"{rng.choice(PREFIXES)}.{rng.choice(PARENTS)}.{rng.choice(LEAVES)}"
        layer = schemes.runtime_layer(shard)
        checkpoint = SimpleNamespace(
            ignore_entries=lambda entries=entries: ("ignore", entries),
            quantization={"config_groups": {"group_0": {"targets": targets}}},
        )
        ours = doctor._ignored(checkpoint, shard, facts.Release.of(INSTALLED, None, "cpu"))
        try:
            theirs = ct_utils.should_ignore_layer(layer, entries, FUSED_MAPPING)
        except ValueError as error:
            assert "different quantization schemes" in str(error)
            theirs = None
        assert ours == theirs, (layer, entries)
        compared["mixed" if ours is None else "ignored" if ours else "targeted"] += 1
        if ours is False:
            matched = ct_utils.find_matched_target(layer, object(), targets, FUSED_MAPPING)
            assert (doctor._targeting_group(checkpoint, shard) is not None) == (matched is not None), (
                layer,
                targets,
            )
    assert all(compared.values()), compared


def test_the_doctors_compressed_tensors_matchers_are_vllms():
    """The doctor resolves each MTP module's compressed-tensors group (mtpq.checkpoint.schemes) with
    mtpq.checkpoint.matching's copies of vLLM's matchers (unfused checkpoint names, no fused mapping)."""
    # vLLM 0.22.1 keeps it private in compressed_tensors.utils; 0.32 imports config_utils' there.
    vllms_match = getattr(ct_utils, "is_equal_or_regex_match", None) or ct_utils._is_equal_or_regex_match
    rng = random.Random(30)
    for _ in range(2000):
        targets = [random_entry(rng) for _ in range(rng.randrange(4))] + rng.choice([[], ["Linear"]])
        rng.shuffle(targets)
        name = f"{rng.choice(PREFIXES)}.{rng.choice(PARENTS)}.{rng.choice(LEAVES)}"
        module = rng.choice([Linear(), QKVParallelLinear(), object()])
        assert matching.should_ignore_layer(name, targets) == ct_utils.should_ignore_layer(name, targets)
        assert matching.find_matched_target(name, module, targets) == ct_utils.find_matched_target(
            name, module, targets
        ), (name, targets)
        for target in targets:
            assert matching.is_equal_or_regex_match(name, target) == vllms_match(name, target)


# --- the words of vLLM's errors ----------------------------------------------------------------------


def joined_literals(text: str) -> str:
    """Source text with adjacent string literals joined, as Python joins them: "a " "b" -> "a b"."""
    return re.sub(r'"\s*\+?\s*f?"', "", text)


def patch_text(series: str, name_part: str) -> str:
    """The source a patch leaves: its added and context lines."""
    (path,) = (ROOT / "patches" / series).glob(f"*{name_part}*.patch")
    lines = path.read_text().splitlines(keepends=True)
    return joined_literals("".join(line[1:] for line in lines if line[:1] in "+ "))


@pytest.mark.parametrize(
    ("words", "series", "patch"),
    [
        (facts.PATCHED_NO_MTP_LAYERS.split("{model}")[0], "v0.33.0", "refuse-mtp-without-mtp-layers"),
        (facts.PATCHED_NO_MTP_LAYERS.split("{model}")[1], "v0.33.0", "refuse-mtp-without-mtp-layers"),
        (facts.PATCHED_NO_MTP_LAYERS.split("{model}")[0], "v0.22.1", "refuse-mtp-without-mtp-layers"),
        (facts.PATCHED_NO_MTP_LAYERS.split("{model}")[1], "v0.22.1", "refuse-mtp-without-mtp-layers"),
        (facts.PATCHED_PREFIX, "v0.33.0", "refuse-mtp-without-mtp-layers"),
        (facts.PATCHED_UNLOADED, "v0.33.0", "check-every-mtp-draft-parameter"),
        (facts.PATCHED_UNLOADED, "v0.22.1", "check-every-mtp-draft-parameter"),
    ],
)
def test_the_doctors_words_for_the_series_errors_are_the_patches(words, series, patch):
    assert words.strip() in patch_text(series, patch)


def test_the_doctors_words_for_stock_vllms_index_error_are_vllms():
    weight_utils = (
        Path(vllm_utils.__file__).parents[1] / "model_executor" / "model_loader" / "weight_utils.py"
    )
    source = joined_literals(weight_utils.read_text())
    words = facts.Release.of(INSTALLED, None, "cpu").stock_index_file_missing
    assert words in source if words else "referenced in index but missing" not in source


MODELOPT_ALGOS = ["FP8", "NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION"]


def random_modelopt_entry(rng: random.Random) -> str:
    name = f"{rng.choice(PREFIXES)}.{rng.choice(PARENTS)}.{rng.choice(LEAVES)}"
    return rng.choice(
        [name, name.rsplit(".", 1)[0] + "*", "*." + name.rsplit(".", 1)[1], rng.choice(PARENTS)]
    )


@pytest.mark.skipif(
    INSTALLED == "0.22.1",
    reason="the doctor's ModelOpt copy follows vLLM 0.32/0.33, whose series refuse what it predicts; "
    "vLLM 0.22.1's ModelOpt classes are older (its MXFP8 config has no quant_method)",
)
def test_the_doctors_modelopt_matching_is_vllms():
    """The doctor picks vLLM's ModelOpt config class for a config and asks it which modules it excludes
    and, for MIXED_PRECISION, which quant_algo builds each, with mtpq.checkpoint.matching's copies
    (unfused checkpoint names)."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    rng = random.Random(30)
    for _ in range(500):
        algo = rng.choice(MODELOPT_ALGOS)
        names = [f"{rng.choice(PREFIXES)}.{rng.choice(PARENTS)}.{rng.choice(LEAVES)}" for _ in range(4)]
        config = {
            "quant_method": "modelopt",
            "quant_algo": algo,
            "group_size": 16,
            "ignore": [random_modelopt_entry(rng) for _ in range(rng.randrange(3))],
            "quantized_layers": {name: {"quant_algo": rng.choice(["FP8", "NVFP4"])} for name in names[:3]},
        }
        [(method, ours)] = [
            (method, matching.get_quantization_config(method))
            for method in matching.QUANTIZATION_METHODS
            if matching.get_quantization_config(method).override_quantization_method(config, None)
        ]
        theirs = get_quantization_config(method)
        assert theirs.override_quantization_method(config, None) == method
        ours, theirs = ours.from_config(config), theirs.from_config(config)
        for name in names:
            assert ours.is_layer_excluded(name) == theirs.is_layer_excluded(name), (name, config)
            if algo == "MIXED_PRECISION":
                assert ours._resolve_quant_algo(name) == theirs._resolve_quant_algo(name), (name, config)
            else:
                assert ours.quant_method == theirs.quant_method


def random_gptq_rule(rng: random.Random) -> str:
    """A GPTQ dynamic rule or AutoRound extra_config key: a name, a suffix or a regex, "+:"/"-:"."""
    prefix, parent, leaf = rng.choice(PREFIXES), rng.choice(PARENTS), rng.choice(LEAVES)
    pattern = rng.choice(
        [f"{prefix}.{parent}.{leaf}", leaf, rf".*\.{parent}\..*", rf"{re.escape(prefix)}\..*"]
    )
    return rng.choice(["", "+:", "-:"]) + pattern


@pytest.mark.skipif(
    INSTALLED == "0.22.1",
    reason="the doctor's GPTQ and AutoRound copy follows vLLM 0.32/0.33, whose series refuse what it "
    "predicts; 0.22.1's is_layer_gptq_quantized takes no nested lists",
)
def test_the_doctors_gptq_and_inc_matching_is_vllms():
    """The doctor builds vLLM's GPTQ config (dynamic rules, modules_in_block_to_quantize) or
    AutoRound/INC config (extra_config, block_name_to_quantize) and asks it which bits build each
    module, with mtpq.checkpoint.matching's copies."""
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.utils import gptq_utils

    rng = random.Random(30)
    for _ in range(250):
        names = [f"{rng.choice(PREFIXES)}.{rng.choice(PARENTS)}.{rng.choice(LEAVES)}" for _ in range(4)]
        rules = {random_gptq_rule(rng): {"bits": rng.choice([4, 8, 16])} for _ in range(rng.randrange(4))}
        blocks = rng.sample(PREFIXES, rng.randrange(3))
        gptq = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}
        gptq |= {"dynamic": {key: rule for key, rule in rules.items() if rule["bits"] != 16}}
        gptq["modules_in_block_to_quantize"] = [rng.sample(names, rng.randrange(3))]
        inc = {"quant_method": "auto-round", "bits": 4, "group_size": 32, "block_name_to_quantize": blocks}
        inc["extra_config"] = {key.removeprefix("+:").removeprefix("-:"): rule for key, rule in rules.items()}
        ours = matching.get_quantization_config("auto_gptq").from_config(gptq)
        theirs = get_quantization_config("auto_gptq").from_config(gptq)
        for name in names:
            for key, default in ((None, None), ("bits", 4)):
                assert matching.get_dynamic_override(
                    ours, name, key, default
                ) == gptq_utils.get_dynamic_override(theirs, name, key, default), (name, gptq)
            assert matching.is_layer_gptq_quantized(
                name, ours.modules_in_block_to_quantize
            ) == gptq_utils.is_layer_gptq_quantized(name, theirs.modules_in_block_to_quantize), (name, gptq)
        ours = matching.get_quantization_config("inc").from_config(inc)
        theirs = get_quantization_config("inc").from_config(inc)
        assert ours.block_name_to_quantize == theirs.block_name_to_quantize
        for name in names:
            assert ours.get_layer_config(None, name)[0] == theirs.get_layer_config(None, name)[0], (name, inc)


_INT8, _FP8 = QUARK_INT8_WEIGHT, QUARK_FP8_WEIGHT
_FP8_BLOCK = {"dtype": "fp8_e4m3", "qscheme": "per_block", "block_size": [128, 128], "symmetric": True}
_INT4 = {"dtype": "int4", "qscheme": "per_group", "group_size": 32, "symmetric": True}
_MXFP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}
_NVFP4 = [{"dtype": "fp4", "qscheme": "per_group", "group_size": 16}, _FP8]
# The entries Quark writes for a linear (and some it cannot build), for the scheme lookup's copy.
QUARK_ENTRIES = [
    QUARK_INT8,
    quark_entry(_INT8, {"dtype": "int8", "qscheme": "per_tensor", "symmetric": True, "is_dynamic": False}),
    QUARK_FP8,
    quark_entry({**_FP8, "qscheme": "per_channel"}, {**_FP8, "is_dynamic": True}),
    quark_entry(
        _FP8_BLOCK, {**_FP8, "qscheme": "per_group", "group_size": 128, "symmetric": True, "is_dynamic": True}
    ),
    quark_entry(_INT4),
    quark_entry(_MXFP4, {**_MXFP4, "is_dynamic": True}),
    quark_entry(_MXFP4),
    quark_entry(_NVFP4, [{**_NVFP4[0], "is_dynamic": True}, _NVFP4[1]]),
    quark_entry(None),
    quark_entry(_INT8),
    quark_entry(_FP8, {**_INT8, "is_dynamic": True}),
]


@pytest.mark.skipif(
    INSTALLED == "0.22.1",
    reason="the doctor's Quark copy follows vLLM 0.32/0.33, whose series refuse what it predicts",
)
def test_the_doctors_quark_matching_is_vllms():
    """The doctor asks vLLM's QuarkConfig which exclude entry leaves a module out, which entry builds
    it (layer_quant_config patterns, layer_type_quant_config, global_quant_config) and which scheme
    that entry builds, with mtpq.checkpoint.matching's copies (unfused checkpoint names)."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.quark import quark, utils

    vllm_config_class = quark.QuarkConfig

    rng = random.Random(26)
    for _ in range(300):
        names = [f"{rng.choice(PREFIXES)}.{rng.choice(PARENTS)}.{rng.choice(LEAVES)}" for _ in range(4)]
        patterns = [random_modelopt_entry(rng) for _ in range(rng.randrange(4))]
        config = header_checkpoints.quark(
            rng.choice(QUARK_ENTRIES),
            {pattern: rng.choice(QUARK_ENTRIES) for pattern in patterns},
            [random_entry(rng) for _ in range(rng.randrange(3))],
        )
        ours, theirs = matching.QuarkConfig.from_config(config), vllm_config_class.from_config(config)
        for name in names:
            assert matching.should_ignore_layer(name, config["exclude"]) == utils.should_ignore_layer(
                name, config["exclude"]
            ), (name, config)
            entry = ours.get_layer_quant_config_from_name(name)
            assert entry is theirs.get_layer_quant_config_from_name(name), (name, config)
            assert ours._find_matched_config(name, matching.LinearBase) is theirs._find_matched_config(
                name, LinearBase
            ), (name, config)
    for entry in QUARK_ENTRIES:
        outcomes = []
        for config_class in (matching.QuarkConfig, vllm_config_class):
            try:
                outcomes.append(config_class({})._get_scheme_cls_from_config(entry)[2].__name__)
            except NotImplementedError:
                outcomes.append("NotImplementedError")
        assert outcomes[0] == outcomes[1], entry
