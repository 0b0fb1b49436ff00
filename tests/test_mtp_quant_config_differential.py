"""Quantization configs over an MTP layer quantized in a scheme of its own, generated over group,
target and ignore shapes: what the series refuses is exactly what would load wrong, and the doctor
predicts it.

The checkpoint is MiMo's engineered one (trunk INT8 W8A8 or W4A16, its MTP layer in the other format,
in a config group of its own). Each case rewrites only its config.json's quantization_config: the MTP
group's targets (exact names, a `re:` pattern with a wildcard layer index, an alternation, the class
`Linear` with the trunk named by pattern, or no MTP group at all), its scheme (the stored one or the
trunk's), the ignore list (an MTP module, the whole MTP layer), a second group of the same scheme
claiming MTP modules, a group naming a module the checkpoint does not store. GPTQ checkpoints (trunk in
group size 128, the MTP layer in 32) get their `dynamic` rules generated the same way: the rule's reach
(a wildcard layer index, an alternation, each module by name), its overrides (the stored group size or
the trunk's), `-:` exclusions (a module, the layer), a rule of nothing first, no rule. Each draft is built and
loaded by patched vLLM as the engine does (tests/probes/mtp_quant_layouts.py). The series' verdict is
that load (0004: no start-up reading of the config), so the properties checked are: a
draft that loads has every MTP module stored quantized built quantized; the doctor refuses exactly
the cases vLLM refuses; stock vLLM refuses layouts the series loads right.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from safetensors import safe_open

from mtpq.checkpoint import doctor
from tests.conftest import target_version
from tests.e2e_cases import GPTQ_MTP_WITHOUT_G_IDX

MTP = "model.mtp_layers.0"
OWN_SCHEMES = (("int8_w8a8", "w4a16"), ("w4a16", "int8_w8a8"))
MTP_TARGETS = {
    "exact": None,  # the checkpoint's own group, as written
    "re-wildcard-index": [r"re:model\.mtp_layers\.\d+\.(self_attn|mlp)\..*"],
    "re-alternation": [r"re:model\.(mtp_layers\.0\.self_attn|mtp_layers\.0\.mlp)\..*"],
    "class": ["Linear"],
    "no-mtp-group": [],
}
IGNORED = {
    "none": [],
    "one-mtp-module": [f"{MTP}.self_attn.o_proj"],
    "mtp-layer": [r"re:model\.mtp_layers\..*"],
}
REFUSED_BY_DOCTOR = "loading refuses the MTP layer the config builds in another format"
SEED, SAMPLED = 42, 16


@dataclass(frozen=True)
class Shape:
    trunk: str
    mtp: str
    targets: str
    scheme: str  # "stored" or "trunk"
    ignored: str
    same_scheme_group: bool
    group_of_nothing: bool

    def name(self) -> str:
        extras = [
            *(["same-scheme-group"] if self.same_scheme_group else []),
            *(["group-of-nothing"] if self.group_of_nothing else []),
        ]
        return "-".join([f"{self.trunk}/{self.mtp}", self.targets, self.scheme, self.ignored, *extras])


def _shapes() -> list[Shape]:
    """Every target shape with the stored scheme and nothing else (the issue's own-group cases), exact
    targets beside a group of the same scheme or of nothing stored, then a seeded sample of the rest."""
    everything = [
        Shape(trunk, mtp, *rest)
        for (trunk, mtp), rest in itertools.product(
            OWN_SCHEMES,
            itertools.product(MTP_TARGETS, ("stored", "trunk"), IGNORED, (False, True), (False, True)),
        )
        if not (rest[0] == "no-mtp-group" and (rest[1] == "trunk" or rest[3]))
    ]
    plain = [
        s
        for s in everything
        if (s.scheme, s.ignored) == ("stored", "none")
        and (s.targets == "exact" or not (s.same_scheme_group or s.group_of_nothing))
    ]
    rest = [s for s in everything if s not in plain]
    return plain + random.Random(SEED).sample(rest, SAMPLED)


SHAPES = _shapes()

# GPTQ `dynamic` rules: a regex in the checkpoint's names each, `+:` with overrides of the config's
# fields, `-:` leaving the modules it reaches unquantized; vLLM takes the first rule a module matches.
GPTQ_LAYER = r"model\.mtp_layers\.\d+\..*"
GPTQ_LINEAR_METHOD = "AutoGPTQLinearMethod"
GPTQ_STORED, GPTQ_TRUNK = {"group_size": 32}, {"group_size": 128}
GPTQ_RULES = {
    "wildcard-index": {f"+:{GPTQ_LAYER}": GPTQ_STORED},
    "alternation": {r"+:model\.mtp_layers\.0\.(self_attn|mlp|input_proj)\b.*": GPTQ_STORED},
    "module-names": None,  # one rule per module the checkpoint stores quantized (gptq_config)
    "rule-of-nothing-first": {
        rf"+:{re.escape(MTP)}\.not_stored_proj": GPTQ_TRUNK,
        f"+:{GPTQ_LAYER}": GPTQ_STORED,
    },
    "trunk-group-size": {f"+:{GPTQ_LAYER}": GPTQ_TRUNK},
    "no-rule": {},
    "module-excluded-first": {rf"-:{re.escape(MTP)}\.self_attn\.o_proj": {}, f"+:{GPTQ_LAYER}": GPTQ_STORED},
    "layer-excluded": {f"-:{GPTQ_LAYER}": {}},
}
# Fields of the MTP group (trunk INT8 W8A8, MTP layer W4A16) set to what no scheme builds (the format)
# and to what the format cannot read (num_bits as a word).
BAD_FIELDS = {"format": (("format",), "no-such-format"), "num_bits": (("weights", "num_bits"), "four")}


def quantization_config(base: dict, shape: Shape) -> dict:
    config = copy.deepcopy(base)
    groups = config["config_groups"]
    trunk, own = groups["group_0"], groups["mtp_group"]
    if shape.scheme == "trunk":
        own = {**copy.deepcopy(trunk), "targets": own["targets"]}
    if (targets := MTP_TARGETS[shape.targets]) is not None:
        own = {**own, "targets": targets}
    if shape.targets == "class":
        trunk["targets"] = [r"re:model\.layers\.\d+\..*"]
    groups["mtp_group"] = own
    if not own["targets"]:
        del groups["mtp_group"]
    if shape.same_scheme_group:
        groups["mlp_group"] = {**copy.deepcopy(own), "targets": [r"re:model\.mtp_layers\.0\.mlp\..*"]}
    if shape.group_of_nothing:
        groups["nothing_group"] = {**copy.deepcopy(own), "targets": [f"{MTP}.not_stored_proj"]}
    config["ignore"] = [*config["ignore"], *IGNORED[shape.ignored]]
    return config


def gptq_config(base: dict, rules: str, stored_quantized: list[str]) -> dict:
    dynamic = GPTQ_RULES[rules]
    if dynamic is None:
        dynamic = {f"+:{re.escape(module)}": GPTQ_STORED for module in stored_quantized}
    return {
        **{key: value for key, value in base.items() if key != "dynamic"},
        **({"dynamic": dynamic} if dynamic else {}),
    }


def write_layouts(root: Path, source: Path, configs: dict[str, dict]) -> dict[str, Path]:
    """Layout name -> a checkpoint directory: source's files (hard links) under that config.json's
    quantization_config."""
    directories = {}
    for name, quant_config in configs.items():
        directory = root / name.replace("/", "_")
        directory.mkdir()
        for file in source.iterdir():
            if file.name != "config.json":
                os.link(file, directory / file.name)
        config = json.loads((source / "config.json").read_text())
        (directory / "config.json").write_text(
            json.dumps({**config, "quantization_config": quant_config}, indent=2)
        )
        directories[name] = directory
    return directories


def build_and_load(vllm_probe, layouts: dict[str, Path]) -> dict[str, dict]:
    """variant -> layout name -> the draft's build and load (mtp_vllm.build_and_load)."""
    name_of = {str(directory): name for name, directory in layouts.items()}
    return {
        variant: {
            name_of[directory]: draft
            for directory, draft in vllm_probe("mtp_quant_layouts", variant, *name_of)["drafts"].items()
        }
        for variant in ("patched", "unpatched")
    }


@pytest.fixture(scope="module")
def layouts(engineered_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """Shape name -> the engineered own-scheme checkpoint under the shape's config.json."""
    root = tmp_path_factory.mktemp("quant-config-shapes")
    directories = {}
    for shape in SHAPES:
        source = engineered_checkpoint(shape.trunk, "mimo", ignore_style="unlisted", mtp_quant=shape.mtp)
        base = json.loads((source / "config.json").read_text())["quantization_config"]
        directories |= write_layouts(root, source, {shape.name(): quantization_config(base, shape)})
    return directories


@pytest.fixture(scope="module")
def drafts(vllm_probe, layouts):
    return build_and_load(vllm_probe, layouts)


@pytest.fixture(scope="module")
def gptq_on_this_release():
    if reason := GPTQ_MTP_WITHOUT_G_IDX.get(target_version()):
        pytest.skip(reason)


@pytest.fixture(scope="module")
def gptq_layouts(gptq_on_this_release, engineered_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """Rules name -> the engineered GPTQ own-scheme checkpoint under those `dynamic` rules."""
    source = engineered_checkpoint(
        "gptq_w4a16", "mimo", ignore_style="unlisted", mtp_quant="gptq_w4a16_g32", mtp_targets="regex"
    )
    base = json.loads((source / "config.json").read_text())["quantization_config"]
    names = [name for file in source.glob("*.safetensors") for name in safe_open(file, "pt").keys()]
    stored = sorted(
        name.removesuffix(".qweight") for name in names if name.startswith(MTP) and name.endswith(".qweight")
    )
    configs = {f"gptq-{rules}": gptq_config(base, rules, stored) for rules in GPTQ_RULES}
    return write_layouts(tmp_path_factory.mktemp("gptq-dynamic-rules"), source, configs)


@pytest.fixture(scope="module")
def gptq_drafts(vllm_probe, gptq_layouts):
    return build_and_load(vllm_probe, gptq_layouts)


def refused(draft: dict) -> bool:
    return "build" in draft or draft["load"] != "ok"


def check_verdict(name: str, layout: Path, draft: dict, quantized_as: str) -> tuple[str, str] | None:
    """The series' verdict on a layout agrees with the doctor's; a refusal names the MTP module and
    config.json, and returns (module, the entries of quantization_config named as building it, "" for
    none: no entry changes how the config's own fields build it); a load
    has the MTP block's projections, all stored quantized, built by the quant method quantized_as (None)."""
    # On CUDA: the probe stands in for the kernels this CPU lacks, so only the draft's format is judged.
    predicted = doctor.diagnose(layout, [target_version()], "cuda").verdicts[target_version()]["patched"]
    print(f"\n{name}: series {'refuses' if refused(draft) else 'loads'}, doctor {predicted.why}")
    assert refused(draft) == (predicted.why == REFUSED_BY_DOCTOR), (draft, predicted)
    if refused(draft):
        error = draft.get("build", draft["load"])["error"]
        assert "mtp_layers." in error, error  # the MTP module, by its checkpoint or its draft name
        assert "quantization_config in " in error and "/config.json" in error, error  # what built it so
        named = re.search(
            r"\((model\.mtp_layers\.0\.\S+): by (?:its entr(?:y|ies) (.*?)|none of its entries)\), which",
            error,
        )
        assert named, error
        return named[1], named[2] or ""
    projections = {
        name: method
        for name, method in draft["linears"].items()
        if ".mtp_block." in name and name.endswith("_proj")
    }
    assert projections and set(projections.values()) == {quantized_as}, projections
    return None


@pytest.mark.parametrize("shape", SHAPES, ids=Shape.name)
def test_the_series_refuses_what_would_load_wrong_and_the_doctor_predicts_it(layouts, drafts, shape):
    draft = drafts["patched"][shape.name()]
    named = check_verdict(shape.name(), layouts[shape.name()], draft, "CompressedTensorsLinearMethod")
    if named is None:
        return
    # The entries that built the module so: the ignore entry where one keeps a quantized module
    # unquantized, else the group targets that reach it.
    module, entries = named
    ignored = any(re.fullmatch(entry.removeprefix("re:"), module) for entry in IGNORED[shape.ignored])
    assert ("ignore[" in entries) == ignored, entries
    assert ("ignore[" in entries) != ("targets[" in entries), entries


@pytest.mark.parametrize("rules", GPTQ_RULES)
def test_gptq_dynamic_rules_refused_exactly_where_they_would_load_wrong(gptq_layouts, gptq_drafts, rules):
    name = f"gptq-{rules}"
    named = check_verdict(name, gptq_layouts[name], gptq_drafts["patched"][name], GPTQ_LINEAR_METHOD)
    if named is None:
        return
    # The rule that built the module so, where the first to reach it changes how the config's own
    # fields build it; else none.
    module, entries = named
    reaching = next((key for key in GPTQ_RULES[rules] or {} if re.fullmatch(key[2:], module)), None)
    changes = reaching is not None and GPTQ_RULES[rules][reaching] != GPTQ_TRUNK
    assert changes == ("dynamic[" in entries), entries


@pytest.fixture(scope="module")
def bad_field_drafts(vllm_probe, engineered_checkpoint, tmp_path_factory) -> dict[str, dict]:
    """ "layouts": field -> the checkpoint under that MTP group field's bad value; per variant, field ->
    the draft's build and load."""
    source = engineered_checkpoint("int8_w8a8", "mimo", ignore_style="unlisted", mtp_quant="w4a16")
    base = json.loads((source / "config.json").read_text())["quantization_config"]
    configs = {}
    for name, ((*parents, field), value) in BAD_FIELDS.items():
        config = copy.deepcopy(base)
        group = config["config_groups"]["mtp_group"]
        for parent in parents:
            group = group[parent]
        group[field] = value
        configs[name] = config
    layouts = write_layouts(tmp_path_factory.mktemp("bad-mtp-group-fields"), source, configs)
    return {"layouts": layouts, **build_and_load(vllm_probe, layouts)}


def start_up_error(drafts: dict, field: str) -> str:
    """The series' error for the bad field, one before any weight is read; stock's (wherever it stops)
    names no file."""
    stock = drafts["unpatched"][field]
    assert refused(stock) and "config.json" not in stock.get("build", stock.get("load"))["error"], stock
    series = drafts["patched"][field]
    assert set(series) == {"build"}, series
    print(f"\n{field}: {series['build']['error']}")
    return series["build"]["error"]


def test_an_mtp_group_no_scheme_builds_is_one_start_up_error_naming_config_json_and_the_module(
    bad_field_drafts,
):
    """Stock builds the draft under names the MTP group does not reach and stops at load; the series
    refuses the build naming the MTP module, config.json and the group's entries that bring the module
    to it, 0009."""
    error = start_up_error(bad_field_drafts, "format")
    assert re.search(rf"MTP draft module {re.escape(MTP)}\.\S+ \(\w+\) cannot be built", error), error
    directory = bad_field_drafts["layouts"]["format"]
    assert f"quantization_config in {directory}/config.json decides" in error, error
    assert re.search(rf"by its entr(y|ies) config_groups\.mtp_group\.targets\[\d+\]='{MTP}\.", error)


def test_an_mtp_group_field_the_format_cannot_read_is_one_start_up_error_naming_config_json_and_it(
    bad_field_drafts,
):
    """Stock stops on pydantic's bare error; the series names config.json and the entry, 0009."""
    error = start_up_error(bad_field_drafts, "num_bits")
    directory = bad_field_drafts["layouts"]["num_bits"]
    assert f"quantization_config in {directory}/config.json cannot be read by " in error, error
    assert "config_groups.mtp_group.weights.num_bits='four'" in error, error


def refused_by_stock_only(drafts: dict) -> list[str]:
    series, stock = drafts["patched"], drafts["unpatched"]
    return [name for name, draft in series.items() if not refused(draft) and refused(stock[name])]


def test_stock_vllm_refuses_own_scheme_layouts_the_series_loads(drafts):
    """Stock vLLM's old failure: it builds the MTP layer under the draft's names, which the MTP group's
    targets (written in the checkpoint's) do not reach, so the trunk's scheme meets the MTP layer's
    tensors and the load fails."""
    assert refused_by_stock_only(drafts)


def test_stock_vllm_refuses_gptq_rules_the_series_loads(gptq_drafts):
    """The same for `dynamic` rules: stock's draft names (model.layers.2) match no MTP rule."""
    assert refused_by_stock_only(gptq_drafts)
