"""Quantization configs over an MTP layer quantized in a scheme of its own, generated over group,
target and ignore shapes: what the series refuses is exactly what would load wrong, and the doctor
predicts it.

The checkpoint is MiMo's engineered one (trunk INT8 W8A8 or W4A16, its MTP layer in the other format,
in a config group of its own). Each case rewrites only its config.json's quantization_config: the MTP
group's targets (exact names, a `re:` pattern with a wildcard layer index, an alternation, the class
`Linear` with the trunk named by pattern, or no MTP group at all), its scheme (the stored one or the
trunk's), the ignore list (an MTP module, the whole MTP layer), a second group of the same scheme
claiming MTP modules, a group naming a module the checkpoint does not store. Each draft is built and
loaded by patched vLLM as the engine does (tests/probes/mtp_quant_layouts.py). The series' verdict is
that load (0004, 0004a, 0004b: no start-up reading of the config), so the properties checked are: a
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

from mtpq.checkpoint import doctor
from tests.conftest import target_version

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


@pytest.fixture(scope="module")
def layouts(engineered_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """Shape name -> a checkpoint directory: the engineered own-scheme checkpoint's files (hard links)
    under the shape's config.json."""
    root = tmp_path_factory.mktemp("quant-config-shapes")
    directories = {}
    for shape in SHAPES:
        source = engineered_checkpoint(shape.trunk, "mimo", ignore_style="unlisted", mtp_quant=shape.mtp)
        directory = root / shape.name().replace("/", "_")
        directory.mkdir()
        for file in source.iterdir():
            if file.name != "config.json":
                os.link(file, directory / file.name)
        config = json.loads((source / "config.json").read_text())
        config["quantization_config"] = quantization_config(config["quantization_config"], shape)
        (directory / "config.json").write_text(json.dumps(config, indent=2))
        directories[shape.name()] = directory
    return directories


@pytest.fixture(scope="module")
def drafts(vllm_probe, layouts):
    """variant -> shape name -> the draft's build and load (mtp_vllm.build_and_load)."""
    shape_of = {str(directory): name for name, directory in layouts.items()}
    return {
        variant: {
            shape_of[directory]: draft
            for directory, draft in vllm_probe("mtp_quant_layouts", variant, *shape_of)["drafts"].items()
        }
        for variant in ("patched", "unpatched")
    }


def refused(draft: dict) -> bool:
    return "build" in draft or draft["load"] != "ok"


@pytest.mark.parametrize("shape", SHAPES, ids=Shape.name)
def test_the_series_refuses_what_would_load_wrong_and_the_doctor_predicts_it(layouts, drafts, shape):
    draft = drafts["patched"][shape.name()]
    # On CUDA: the probe stands in for the kernels this CPU lacks, so only the draft's format is judged.
    diagnosis = doctor.diagnose(layouts[shape.name()], [target_version()], "cuda")
    predicted = diagnosis.verdicts[target_version()]["patched"]
    print(f"\n{shape.name()}: series {'refuses' if refused(draft) else 'loads'}, doctor {predicted.why}")
    assert refused(draft) == (predicted.why == REFUSED_BY_DOCTOR), (draft, predicted)
    if refused(draft):
        error = draft.get("build", draft["load"])["error"]
        assert "mtp_layers." in error, error  # the MTP module, by its checkpoint or its draft name
        assert "quantization_config in " in error and "/config.json" in error, error  # what built it so
        # ... and the entries of it that built the module so: the ignore entry where one keeps a
        # quantized module unquantized, else the group targets that reach it.
        entries = re.search(r"\((model\.mtp_layers\.0\.\S+): by its entr(?:y|ies) (.*?)\), which", error)
        assert entries, error
        module, named = entries[1], entries[2]
        ignored = any(re.fullmatch(entry.removeprefix("re:"), module) for entry in IGNORED[shape.ignored])
        assert ("ignore[" in named) == ignored, error
        assert ("ignore[" in named) != ("targets[" in named), error
        return
    # Loaded (the series' check of every draft parameter passed): the MTP block's projections, all
    # stored quantized, were built quantized.
    projections = {
        name: method
        for name, method in draft["linears"].items()
        if ".mtp_block." in name and name.endswith("_proj")
    }
    assert projections and set(projections.values()) == {"CompressedTensorsLinearMethod"}, projections


def test_stock_vllm_refuses_own_scheme_layouts_the_series_loads(drafts):
    """Stock vLLM's old failure: it builds the MTP layer under the draft's names, which the MTP group's
    targets (written in the checkpoint's) do not reach, so the trunk's scheme meets the MTP layer's
    tensors and the load fails."""
    series, stock = drafts["patched"], drafts["unpatched"]
    assert [name for name, draft in series.items() if not refused(draft) and refused(stock[name])]
