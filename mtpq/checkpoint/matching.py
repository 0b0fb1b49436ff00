"""vLLM's compressed-tensors, ModelOpt, GPTQ, AutoRound/INC and Quark name matching, standard library
only, for the doctor: which scheme a checkpoint's quantization_config builds each MTP module with
(mtpq.checkpoint.schemes) and which entries name it.

They keep vLLM's names and are called with checkpoint module names, which are never fused, so no
fused-layer mapping is needed. tests/test_doctor_copies.py compares them with vLLM's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatch


def is_equal_or_regex_match(value: str, target: str, check_contains: bool = False) -> bool:
    """`target` equals `value`, or, as `re:<pattern>`, matches it from its start; with
    check_contains, a plain target may also be contained in it (case-insensitive)."""
    if target.startswith("re:"):
        return bool(re.match(target[3:], value))
    if check_contains:
        return target.lower() in value.lower()
    return target == value


def find_matched_target(layer_name: str, module: object, targets: Iterable[str]) -> str | None:
    """The first target naming the layer, else the first naming its module's class."""
    targets = list(targets)
    by_name = (target for target in targets if is_equal_or_regex_match(layer_name, target))
    by_class = (target for target in targets if is_equal_or_regex_match(type(module).__name__, target, True))
    return next(by_name, None) or next(by_class, None)


def should_ignore_layer(layer_name: str, ignore: Iterable[str]) -> bool:
    return any(is_equal_or_regex_match(layer_name, entry) for entry in ignore)


# vLLM's ModelOpt config classes, as far as the check reads them: which class a config picks
# (override_quantization_method), its exclude_modules matching and, for MIXED_PRECISION, its
# quantized_layers lookup, for the unfused names a checkpoint writes.
QUANTIZATION_METHODS = ("modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed")


class _ModelOptConfig:
    accepts = staticmethod(lambda algo: algo == "FP8")

    def __init__(self, config: dict) -> None:
        source = config.get("quantization", config)
        self.quant_method = str(source.get("quant_algo")).upper()
        self.exclude_modules = source.get("exclude_modules" if "quantization" in config else "ignore", [])

    @classmethod
    def override_quantization_method(cls, config: dict, user_quant: object) -> bool:
        if not str(config.get("quant_method", "")).lower().startswith("modelopt"):
            return False
        return cls.accepts(str(config.get("quantization", config).get("quant_algo", "")).upper())

    @classmethod
    def from_config(cls, config: dict) -> _ModelOptConfig:
        return cls(config)

    def is_layer_excluded(self, prefix: str) -> bool:
        return any(
            entry in prefix
            or (prefix.startswith("language_model.") and entry in prefix.removeprefix("language_model."))
            or fnmatch(prefix, entry)
            for entry in self.exclude_modules
        )


class _ModelOptFp4Config(_ModelOptConfig):
    accepts = staticmethod(lambda algo: "FP4" in algo)


class _ModelOptMxFp8Config(_ModelOptConfig):
    accepts = staticmethod(lambda algo: "MXFP8" in algo)


class _ModelOptMixedPrecisionConfig(_ModelOptConfig):
    accepts = staticmethod(lambda algo: algo == "MIXED_PRECISION")

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.quantized_layers = config.get("quantization", config).get("quantized_layers", {})

    def _resolve_quant_algo(self, prefix: str) -> str | None:
        if prefix in self.quantized_layers:
            return self.quantized_layers[prefix]["quant_algo"].upper()
        return next(
            (
                info["quant_algo"].upper()
                for key, info in self.quantized_layers.items()
                if key.startswith(prefix + ".")
            ),
            None,
        )


# vLLM's GPTQ and AutoRound/INC configs, as far as the check reads them: GPTQ's dynamic rules and
# modules_in_block_to_quantize, and the bits INC gives a module (extra_config by name, suffix or
# regex; block_name_to_quantize).
def get_dynamic_override(config: object, layer_name: str, key: str | None = None, default_value=None):
    for pattern, rule in config.dynamic.items():
        if pattern.startswith("-:"):
            if re.match(pattern.removeprefix("-:"), layer_name):
                return False
        elif re.match(pattern.removeprefix("+:"), layer_name):
            return rule if key is None else rule.get(key, default_value)
    return default_value


def is_layer_gptq_quantized(prefix: str, quantized_layers: list) -> bool:
    flat = [name for entry in quantized_layers for name in (entry if isinstance(entry, list) else [entry])]
    return not flat or any(name in prefix for name in flat)


def _get_from_keys(config: dict, keys: list[str]):
    """QuantizationConfig.get_from_keys: the first of the keys, else vLLM's own refusal."""
    for key in keys:
        if key in config:
            return config[key]
    raise ValueError(f"Cannot find any of {keys} in the model's quantization config.")


class _AutoGPTQConfig:
    def __init__(self, config: dict) -> None:
        self.weight_bits = _get_from_keys(config, ["bits"])
        self.group_size = _get_from_keys(config, ["group_size"])
        self.dynamic = config.get("dynamic") or {}
        self.modules_in_block_to_quantize = config.get("modules_in_block_to_quantize") or []

    @classmethod
    def from_config(cls, config: dict) -> _AutoGPTQConfig:
        return cls(config)


class _INCConfig(_AutoGPTQConfig):
    _REGEX_CHARS = set(r"*+?^$()[]{}|\\")

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.data_type = "fp" if config.get("data_type", "int") == "fp8" else config.get("data_type", "int")
        blocks = config.get("block_name_to_quantize", config.get("to_quant_block_names"))
        self.block_name_to_quantize = blocks.split(",") if isinstance(blocks, str) else blocks
        self.extra_config = config.get("extra_config")

    def get_layer_config(self, layer: None, name: str) -> tuple[int, None, None]:
        """The bits of an unfused checkpoint module (the check reads no group size or symmetry)."""
        extra = self.extra_config or {}
        key = next((key for key in extra if name == key), None) or next(
            (key for key in extra if name.endswith(f".{key}")), None
        )
        if key is not None:
            return extra[key].get("bits", self.weight_bits), None, None
        quantized = not self.block_name_to_quantize or any(
            name.startswith(block) for block in self.block_name_to_quantize
        )
        default = self.weight_bits if quantized else 16
        rule = next(
            (
                rule
                for pattern, rule in extra.items()
                if self._REGEX_CHARS & set(pattern) and _searches(pattern, name)
            ),
            {},
        )
        return rule.get("bits", default), None, None


def _searches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def get_quantization_config(method: str) -> type[_ModelOptConfig] | type[_AutoGPTQConfig]:
    return {
        "modelopt": _ModelOptConfig,
        "modelopt_fp4": _ModelOptFp4Config,
        "modelopt_mxfp8": _ModelOptMxFp8Config,
        "modelopt_mixed": _ModelOptMixedPrecisionConfig,
        "auto_gptq": _AutoGPTQConfig,
        "inc": _INCConfig,
    }[method]


# vLLM's QuarkConfig, as far as the check reads it: exclude, then layer_quant_config by name
# pattern (the first match wins; a pattern without "*" matches the names it contains), then
# layer_type_quant_config by layer class, then global_quant_config; and the scheme class an entry
# builds (_get_scheme_cls_from_config), for the entries Quark writes.
class LinearBase:
    pass


def _quark_scheme(name: str) -> type:
    return type(name, (), {})


_QUARK_SCHEMES = {
    name: _quark_scheme(name)
    for name in (
        "QuarkNVFP4",
        "QuarkOCP_MX",
        "QuarkW4A8_MXFP4_FP8",
        "QuarkW4A16Int4",
        "QuarkW8A8Fp8",
        "QuarkW8A8Fp8PerBlock",
        "QuarkW8A8Int8",
    )
}


def _quark_scheme_name(weight: object, inputs: object, pack_method: str) -> str | None:
    if isinstance(weight, list) or isinstance(inputs, list):
        pair = isinstance(weight, list) and len(weight) == 2 and isinstance(inputs, list) and len(inputs) == 2
        fp4 = pair and [w.get("dtype") for w in weight] == ["fp4", "fp8_e4m3"]
        return "QuarkNVFP4" if fp4 and weight[0].get("group_size") == 16 else None
    if not isinstance(weight, dict):
        return None
    dtype, qscheme, input_dtype = weight.get("dtype"), weight.get("qscheme"), (inputs or {}).get("dtype")
    if dtype == "fp8_e4m3" and input_dtype == "fp8_e4m3" and not weight.get("is_dynamic"):
        if qscheme == "per_block":
            return "QuarkW8A8Fp8PerBlock"
        return "QuarkW8A8Fp8" if qscheme in ("per_tensor", "per_channel") else None
    if dtype == "int8" and input_dtype == "int8" and weight.get("symmetric") is True:
        return "QuarkW8A8Int8" if qscheme in ("per_tensor", "per_channel") else None
    if dtype in ("int4", "uint4") and inputs is None and pack_method in ("order", "reorder"):
        return "QuarkW4A16Int4"
    if dtype == "fp4" and input_dtype == "fp8_e4m3" and not (inputs or {}).get("is_dynamic"):
        return "QuarkW4A8_MXFP4_FP8"
    if dtype in ("fp4", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3") and qscheme == "per_group":
        return "QuarkOCP_MX"
    return None


class QuarkConfig:
    def __init__(self, quant_config: dict, pack_method: str = "reorder") -> None:
        self.quant_config = quant_config
        self.pack_method = pack_method

    @classmethod
    def from_config(cls, config: dict) -> QuarkConfig:
        if config.get("export") is None:
            raise ValueError(
                "The export key should be included in the configurations of Quark quantized model"
            )
        return cls(config, config["export"].get("pack_method"))

    def get_layer_quant_config_from_name(self, layer_name: str) -> dict | None:
        for pattern, config in (self.quant_config.get("layer_quant_config") or {}).items():
            if (layer_name in pattern) if "*" not in pattern else fnmatch(layer_name, pattern):
                return config
        return None

    def _find_matched_config(self, layer_name: str, layer_type: type) -> dict:
        fallback = self.quant_config.get("layer_type_quant_config").get(
            layer_type, self.quant_config.get("global_quant_config")
        )
        found = self.get_layer_quant_config_from_name(layer_name)
        return fallback if found is None else found

    def _get_scheme_cls_from_config(self, config: dict) -> tuple[None, None, type]:
        if config.get("output_tensors") or config.get("bias"):
            raise NotImplementedError(
                "Currently, Quark models with output_tensors and bias quantized are not supported"
            )
        weight, inputs = config.get("weight"), config.get("input_tensors")
        if isinstance(weight, list) and len(weight) == 1:
            weight = weight[0]
        if isinstance(inputs, list) and len(inputs) == 1:
            inputs = inputs[0]
        name = _quark_scheme_name(weight, inputs, self.pack_method)
        if name is None:
            raise NotImplementedError(
                f"No quark compatible scheme was found. Weight config: {weight}, Input config: {inputs}"
            )
        return None, None, _QUARK_SCHEMES[name]
