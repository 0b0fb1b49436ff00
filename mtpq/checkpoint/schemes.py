"""Which scheme a checkpoint's quantization_config builds each quantized MTP module with, and whether
that scheme loads what the checkpoint stores: the doctor's prediction of the series' load-time refusal.

Patched vLLM has no start-up reading of the config for this: its draft is built by the config's own
code and a tensor the built parameter would cast silently, or a parameter no tensor loads, stops the
load (v0.32.0/v0.33.0 0004). The doctor reads checkpoints without vLLM, so it resolves
each module with the standard-library copies of vLLM's matching in mtpq.checkpoint.matching (compared
with vLLM's own by tests/test_doctor_copies.py), by the checkpoint's module names, and compares the
scheme with the module's on-disk format as the series' survey labels it. Only what would load wrong
is a problem: a module built unquantized, or in a scheme that cannot load its tensors. Two config
groups claiming one module are resolved as vLLM resolves them (the first target naming it, else the
first naming its class), and a group matching nothing on disk is harmless.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Callable, Mapping

from mtpq.checkpoint import matching
from mtpq.checkpoint.facts import FLOAT_DTYPES
from mtpq.core.errors import MtpqError


class MtpQuantSchemeError(MtpqError, ValueError):
    """The quantization config builds an MTP module stored quantized in a scheme that cannot load it."""


# compressed-tensors format -> the on-disk formats (survey labels) it loads.
_LOADED_BY_FORMAT = {
    "pack-quantized": {"compressed-tensors pack-quantized"},
    "nvfp4-pack-quantized": {"compressed-tensors NVFP4"},
    "int-quantized": {"compressed-tensors INT8"},
    "float-quantized": {"FP8 (compressed-tensors/ModelOpt)"},
    "naive-quantized": {"compressed-tensors INT8", "FP8 (compressed-tensors/ModelOpt)"},
}
# ModelOpt quant_algo -> the on-disk formats it loads.
_LOADED_BY_MODELOPT_ALGO = {
    "FP8": {"FP8 (compressed-tensors/ModelOpt)"},
    "NVFP4": {"ModelOpt NVFP4"},
    "W4A16_NVFP4": {"ModelOpt NVFP4"},
}
# Quark scheme -> the on-disk formats it loads. The tensors of Quark's other schemes (W4A16 INT4,
# OCP MX) are of no format the survey names.
_LOADED_BY_QUARK_SCHEME = {
    "QuarkW8A8Fp8": {"FP8 (compressed-tensors/ModelOpt)"},
    "QuarkW8A8Fp8PerBlock": {"FP8 (compressed-tensors/ModelOpt)"},
    "QuarkW8A8Int8": {"compressed-tensors INT8"},
    "QuarkNVFP4": {"ModelOpt NVFP4"},
}
# quant_method -> the vLLM quantization method that builds it.
_GPTQ_FAMILY_METHODS = {"gptq": "auto_gptq", "auto-round": "inc", "inc": "inc"}
# A module's name as built -> its (bits, group size), None where unquantized, and what decided it.
GptqBuilds = Callable[[str], tuple[tuple[int, int] | None, str]]


class _StoredLinear:
    """A stored 2-D weight, as find_matched_target sees the module vLLM builds for it: targets naming
    a class match a name that contains them ("Linear")."""


def check_mtp_quant_schemes(
    quantized: Mapping[str, str],
    tensors: Mapping,
    quantization_config: Mapping,
    files: list[str],
    config_file: str,
) -> None:
    """Check, per MTP module stored quantized (module -> its survey label), the scheme the config builds
    it with. Raises MtpQuantSchemeError listing every module that would load wrong; the config classes'
    own errors (a field missing) propagate as vLLM raises them."""
    if not quantized or not isinstance(quantization_config, Mapping):
        return
    method = quantization_config.get("quant_method")
    problems_of = {
        "compressed-tensors": _compressed_tensors_problems,
        "modelopt": _modelopt_problems,
        "quark": _quark_problems,
        **dict.fromkeys(_GPTQ_FAMILY_METHODS, _gptq_problems),
    }.get(method)
    if problems_of is None:
        return
    stored_in = ", ".join(os.path.basename(file) for file in files)
    problems = problems_of(quantized, tensors, quantization_config, stored_in)
    if problems:
        raise MtpQuantSchemeError(
            f"{config_file}: the quantization_config does not build the MTP layer in the format the "
            "checkpoint stores it:\n  - "
            + "\n  - ".join(problems[:8])
            + (f"\n  (+{len(problems) - 8} more)" if len(problems) > 8 else "")
        )


def _where(module: str, stored: str, stored_in: str) -> str:
    return f"MTP module {module} (stored as {stored} in {stored_in})"


def _compressed_tensors_problems(quantized, tensors, quantization_config, stored_in) -> list[str]:
    """vLLM's CompressedTensorsConfig: the ignore list first, then one target among every group's (a
    target several groups list belongs to the last), by name before by class."""
    groups = quantization_config.get("config_groups") or {}
    group_of_target = {target: name for name, group in groups.items() for target in group.get("targets", [])}
    problems: list[str] = []
    for module, stored in sorted(quantized.items()):
        where = _where(module, stored, stored_in)
        if matching.should_ignore_layer(module, quantization_config.get("ignore") or []):
            problems.append(
                f"{where} is excluded by the config's ignore list, so it would be built unquantized"
            )
            continue
        target = matching.find_matched_target(module, _StoredLinear(), group_of_target)
        if target is None:
            problems.append(f"{where} is claimed by no config group, so it would be built unquantized")
            continue
        name = group_of_target[target]
        fmt = groups[name].get("format") or quantization_config.get("format")
        loadable = _LOADED_BY_FORMAT.get(fmt)
        if loadable is not None and stored not in loadable:
            problems.append(
                f"{where} is built by config group {name!r} (target {target!r}) as {fmt}, which cannot "
                f"load {stored}"
            )
    return problems


def _modelopt_problems(quantized, tensors, quantization_config, stored_in) -> list[str]:
    """The ModelOpt quant_algo vLLM builds each module with, by the config class vLLM picks (its
    exclude_modules matching; for MIXED_PRECISION, its quantized_layers lookup)."""
    config_class = next(
        (
            cls
            for method in matching.QUANTIZATION_METHODS
            if (cls := matching.get_quantization_config(method)).override_quantization_method(
                dict(quantization_config), None
            )
        ),
        None,
    )
    if config_class is None:
        return []
    quant_config = config_class.from_config(dict(quantization_config))
    mixed = hasattr(quant_config, "quantized_layers")
    problems: list[str] = []
    for module, stored in sorted(quantized.items()):
        where = _where(module, stored, stored_in)
        if quant_config.is_layer_excluded(module):
            problems.append(
                f"{where} is excluded by the config's exclude_modules, so it would be built unquantized"
            )
            continue
        if mixed:
            algo, source = quant_config._resolve_quant_algo(module), "its quantized_layers entry"
        else:
            algo, source = quant_config.quant_method, "the config's quant_algo"
        if algo is None:
            problems.append(f"{where} has no quantized_layers entry, so it would be built unquantized")
        elif stored not in _LOADED_BY_MODELOPT_ALGO.get(algo, {stored}):
            problems.append(f"{where} is built by {source} as {algo}, which cannot load {stored}")
    return problems


def _packed_bits(tensors: Mapping, module: str) -> int | None:
    """The bits per weight of a GPTQ/AWQ module: its qzeros pack 32 // bits zero points per int32
    along the output dimension its scales hold unpacked."""
    qzeros, scales = tensors.get(f"{module}.qzeros"), tensors.get(f"{module}.scales")
    if qzeros is None or scales is None or f"{module}.qweight" not in tensors:
        return None
    packed, unpacked = qzeros.shape[-1], scales.shape[-1]
    if qzeros.dtype != "I32" or not packed or unpacked % packed:
        return None
    return 32 // (unpacked // packed)


def _gptq_problems(quantized, tensors, quantization_config, stored_in) -> list[str]:
    """The bits vLLM's GPTQ config (dynamic, modules_in_block_to_quantize) or AutoRound/INC config
    (extra_config, block_name_to_quantize) builds each module with: built unquantized, with other bits
    or group size than it is stored in, or as integers that cannot load what is stored, is a problem."""
    method = _GPTQ_FAMILY_METHODS[quantization_config["quant_method"]]
    if method == "auto_gptq":
        resolve, data_type = gptq_builds(quantization_config, tensors), "int"
    else:
        inc_config = matching.get_quantization_config(method).from_config(dict(quantization_config))
        resolve, data_type = functools.partial(_inc_build, inc_config), inc_config.data_type
    problems: list[str] = []
    for module, stored in sorted(quantized.items()):
        where = _where(module, stored, stored_in)
        build, source = resolve(module)
        if build is None:
            problems.append(f"{where} {source}, so it would be built unquantized")
            continue
        bits, built_group = build
        if data_type != "int":
            continue  # AutoRound's FP8 and MXFP formats: not judged here
        if stored != "GPTQ/AWQ":
            problems.append(f"{where} is built by {source} as {bits}-bit GPTQ, which cannot load {stored}")
        elif (packed := _packed_bits(tensors, module) or bits) != bits:
            problems.append(f"{where} packs {packed}-bit weights but is built by {source} as {bits}-bit GPTQ")
        elif stored_group := _stored_group_size(tensors, module, bits, built_group):
            problems.append(
                f"{where} holds a scale per {stored_group} input rows but is built by {source} with group "
                f"size {built_group}"
            )
    return problems


def _stored_group_size(tensors: Mapping, module: str, bits: int, built_group: int | None) -> int | None:
    """The group size a GPTQ module is stored in where it differs from the one it is built with (-1:
    every input row; None: not judged): its qweight packs 32 // bits input rows per int32, its scales
    hold a row per group."""
    qweight, scales = tensors.get(f"{module}.qweight"), tensors.get(f"{module}.scales")
    if built_group is None or qweight is None or scales is None or not scales.shape[0]:
        return None
    input_rows = qweight.shape[0] * (32 // bits)
    stored = input_rows // scales.shape[0]
    return stored if stored != (input_rows if built_group == -1 else built_group) else None


# Linears vLLM fuses: a shard's runtime layer and every shard it is matched through.
FUSED_LINEARS = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
    ("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa")),
)
EXPERT = re.compile(r"^(?P<experts>.*\.experts)\.\d+\.\w+$")


def runtime_layer(runtime: str) -> str:
    """The layer vLLM builds a checkpoint module into: its fused linear, or its expert layer."""
    if expert := EXPERT.match(runtime):
        return expert["experts"]
    parent, _, leaf = runtime.rpartition(".")
    return next((f"{parent}.{fused}" for fused, shards in FUSED_LINEARS if leaf in shards), runtime)


def gptq_builds(quantization_config: Mapping, tensors: Mapping) -> GptqBuilds:
    """How vLLM's GPTQ config builds a module, by the name it is built under: a function of that name
    giving its (bits, group size), None where unquantized, and what decides it. Where the config lists
    no modules_in_block_to_quantize, vLLM reads them from the headers: the modules stored quantized, by
    their checkpoint names. The config's own errors (a field missing) propagate as vLLM raises them."""
    quant_config = matching.get_quantization_config("auto_gptq").from_config(dict(quantization_config))
    in_block = quant_config.modules_in_block_to_quantize or sorted(
        {tensor.rpartition(".")[0] for tensor, header in tensors.items() if header.dtype not in FLOAT_DTYPES}
    )

    def build(module: str) -> tuple[tuple[int, int] | None, str]:
        # vLLM looks a rule up by the name of the layer it builds: a fused linear's, an expert layer's.
        layer = runtime_layer(module)
        rule = _first_dynamic_rule(quant_config.dynamic, layer)
        if rule and rule.startswith("-:"):
            return None, f"is excluded by its dynamic rule {rule!r}"
        # Routed experts are built as one fused MoE layer, which only dynamic rules exclude.
        if ".experts." not in module and not matching.is_layer_gptq_quantized(module, in_block):
            return None, "is in none of the config's modules_in_block_to_quantize"
        bits, group_size = (
            matching.get_dynamic_override(quant_config, layer, key, default)
            for key, default in (("bits", quant_config.weight_bits), ("group_size", quant_config.group_size))
        )
        return (bits, group_size), f"its dynamic rule {rule!r}" if rule else "the config's bits"

    return build


def _first_dynamic_rule(dynamic: Mapping, module: str) -> str | None:
    """The GPTQ dynamic rule vLLM applies to a module: the first that matches."""
    return next(
        (
            pattern
            for pattern, rule in dynamic.items()
            if matching.get_dynamic_override(_Dynamic({pattern: rule}), module) is not None
        ),
        None,
    )


class _Dynamic:
    """One dynamic rule, as get_dynamic_override reads a config."""

    def __init__(self, dynamic: Mapping) -> None:
        self.dynamic = dynamic


def _inc_build(quant_config, module: str) -> tuple[tuple[int, None] | None, str]:
    """The bits an AutoRound/INC config builds a checkpoint module with (None: unquantized; its group
    size is not judged), and what decides it."""
    # A checkpoint module: neither an LM head nor a fused MoE layer.
    bits, _, _ = quant_config.get_layer_config(None, module)
    blocks = quant_config.block_name_to_quantize
    outside = blocks and not any(module.startswith(block) for block in blocks)
    if bits >= 16 and outside:
        return None, f"is in no block of the config's block_name_to_quantize {blocks}"
    if bits >= 16:
        return None, f"is given {bits} bits by its extra_config entry"
    # Only an extra_config entry gives a module other bits than the config's.
    if outside or bits != quant_config.weight_bits:
        return (bits, None), "its extra_config entry"
    return (bits, None), "the config's bits"


def _quark_scheme_loads(scheme: str, stored: str) -> bool:
    """Whether a Quark scheme loads a survey label; a scheme of no format the survey names loads only
    tensors the survey does not recognize either."""
    loadable = _LOADED_BY_QUARK_SCHEME.get(scheme)
    return stored in loadable if loadable is not None else stored.startswith("unrecognized format")


def _quark_weight_dtypes(entry: Mapping) -> str:
    weight = entry.get("weight")
    weights = weight if isinstance(weight, list) else [weight]
    return "/".join(str(w.get("dtype")) for w in weights if isinstance(w, Mapping))


def _quark_pattern_names(pattern: str, entry: Mapping, module: str) -> bool:
    lookup = matching.QuarkConfig({"layer_quant_config": {pattern: entry}})
    return lookup.get_layer_quant_config_from_name(module) is not None


def _quark_problems(quantized, tensors, quantization_config, stored_in) -> list[str]:
    """The Quark scheme vLLM builds each module with, by QuarkConfig's own matching: exclude first,
    then layer_quant_config by name pattern (the first match wins), layer_type_quant_config,
    global_quant_config."""
    try:
        # from_config edits the entries it reads the KV-cache scheme from.
        quant_config = matching.QuarkConfig.from_config(copy.deepcopy(dict(quantization_config)))
    except ValueError as error:
        return [f"vLLM cannot read it as a Quark config: {error}"]
    exclude = quant_config.quant_config.get("exclude") or []
    patterns = quant_config.quant_config.get("layer_quant_config") or {}
    global_entry = quant_config.quant_config.get("global_quant_config")
    problems: list[str] = []
    for module, stored in sorted(quantized.items()):
        where = _where(module, stored, stored_in)
        if matching.should_ignore_layer(module, exclude):
            entries = [e for e in exclude if matching.should_ignore_layer(module, [e])]
            problems.append(
                f"{where} is excluded by the config's exclude entry {', '.join(map(repr, entries))}, so it "
                "would be built unquantized"
            )
            continue
        # Each pattern tried alone through Quark's own name lookup: the first that names the module.
        claiming = next(
            (pattern for pattern, entry in patterns.items() if _quark_pattern_names(pattern, entry, module)),
            None,
        )
        entry = quant_config._find_matched_config(module, matching.LinearBase)
        if claiming:
            source = f"layer_quant_config pattern {claiming!r}"
        elif entry is global_entry:
            source = "the config's global_quant_config"
        else:
            source = "the config's layer_type_quant_config"
        try:
            _, _, scheme = quant_config._get_scheme_cls_from_config(entry or {})
        except (NotImplementedError, ValueError) as error:
            problems.append(f"{where} gets from {source} no scheme vLLM builds: {error}")
            continue
        if not _quark_scheme_loads(scheme.__name__, stored):
            built = f"{scheme.__name__} (weight {_quark_weight_dtypes(entry)})"
            problems.append(f"{where} is built by {source} as {built}, which cannot load {stored}")
    return problems
