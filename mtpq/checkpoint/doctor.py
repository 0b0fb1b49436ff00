"""`python -m mtpq doctor CKPT`: a checkpoint's MTP fate on stock vLLM and on vLLM with the series,
told from config files and safetensors headers before any GPU is rented.

The survey of the MTP tensors is the series' own (mtpq/checkpoint/survey.py); what each vLLM release
builds from them is facts.py's. The rules combining the two are here: stock_verdict and patched_verdict.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path

from mtpq.checkpoint import facts, matching, schemes
from mtpq.checkpoint.files import CheckpointError, CheckpointFiles
from mtpq.checkpoint.reader import Checkpoint, read_checkpoint, text_config_of
from mtpq.checkpoint.survey import load_survey, series_survey
from mtpq.core.pin import load_pins

WORKS = "works"
OFF = "MTP silently off"
ZERO = "silent 0 % acceptance"
CRASH = "crash"
UNKNOWN = "unknown"

# vLLM's compressed-tensors MoE method decides a whole expert layer from expert 0's projections.
_EXPERT_SHARDS = ("0.gate_proj", "0.up_proj", "0.down_proj")


@dataclass(frozen=True)
class Verdict:
    kind: str  # WORKS, OFF, ZERO, CRASH or UNKNOWN
    why: str
    error: str | None = None  # words of the error vLLM raises (with OFF: when "mtp" is asked for)


@dataclass(frozen=True)
class Declaration:
    count: int | None  # MTP layers vLLM sees (0 when the config says 0); None: no count at all
    known: bool  # False: config.json lacks the field and its default is not known here
    source: str
    field: str | None = None  # the count field, for the fix
    nested: bool = False  # in text_config


@dataclass(frozen=True)
class DraftModule:
    """An MTP module of the checkpoint, as one release's stock draft builds it."""

    name: str  # checkpoint name
    stored: str  # the survey's format label, or the weight's dtype
    runtime: str | None  # the prefix its quantization config sees; None: not established
    built: str  # "quantized", "unquantized", "mixed" (its fused shards disagree) or "unknown"
    note: str = ""


@dataclass
class Diagnosis:
    checkpoint: Checkpoint
    architecture: facts.MtpArchitecture | None
    declaration: Declaration
    survey: object | None  # the survey's MtpSurvey of the MTP tensors present; None: none present
    missing_mtp: dict[str, list[str]]  # file the index names but the directory lacks -> its MTP tensors
    platform: str
    releases: dict[str, facts.Release] = field(default_factory=dict)  # version -> its facts for it
    verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)  # release -> stock/patched
    fixes: dict[str, list[str]] = field(default_factory=dict)
    series: dict[str, str] = field(default_factory=dict)  # release -> the series serving it
    # The release the user named (--vllm) or runs (installed here), judged first; how it was named.
    named: str | None = None
    named_by: str | None = None
    seconds: float = 0.0

    @cached_property
    def mixed_precision(self) -> matching._ModelOptConfig | None:
        """A ModelOpt MIXED_PRECISION config (each quantized module in a quantized_layers entry of its
        own), as vLLM reads it; None for any other config. Built once: each release's verdict reads it."""
        config_class = matching.get_quantization_config("modelopt_mixed")
        if not config_class.override_quantization_method(self.checkpoint.quantization, None):
            return None
        return config_class.from_config(self.checkpoint.quantization)

    @cached_property
    def gptq_builds(self) -> schemes.GptqBuilds | None:
        """How vLLM's GPTQ config builds a module by the name it is built under (schemes.gptq_builds), for
        a GPTQ checkpoint; None for any other. Built once: each release's verdict reads it."""
        if self.checkpoint.quantization.get("quant_method") != "gptq":
            return None
        return schemes.gptq_builds(self.checkpoint.quantization, self.checkpoint.tensors)

    @property
    def tensors_missing(self) -> bool:
        return self.survey is None or bool(self.missing_mtp) or self.layers_missing

    @property
    def layers_missing(self) -> bool:
        """The config declares more MTP layers than the checkpoint stores (the layouts being vLLM's)."""
        count, known_layout = self.declaration.count, self.architecture and self.architecture.layout
        return (
            bool(count and known_layout)
            and _misplaced_layers(self) is None
            and len(self.stored_layers()) < count
        )

    def stored_layers(self) -> list[str]:
        """The MTP layers the checkpoint stores: the survey's roots that are layers (model.mtp_layers.0,
        model.layers.61, mtp.0), and the `layers.{i}` under a root that is not (Qwen3.5's mtp.); one root per
        index where a layer's modules lie under several (ERNIE's model.mtp_block.0, model.mtp_emb_norm.0)."""
        layers = set()
        for prefix in self.survey.prefixes if self.survey else ():
            if prefix.rpartition(".")[2].isdecimal():
                layers.add(prefix)
                continue
            nested = re.compile(rf"({re.escape(prefix)}\.layers\.\d+)\.")
            layers |= {found[1] for name in self.modules() if (found := nested.match(name))}
        by_index = {}
        for layer in sorted(layers):
            by_index.setdefault(layer.rpartition(".")[2], layer)
        return sorted(by_index.values())

    def layouts(self) -> list[str]:
        """Where the checkpoint keeps its MTP layers, as MtpArchitecture.layout writes it."""
        if self.survey is None:
            return []
        return sorted(
            {layout_of(prefix, self.checkpoint.num_hidden_layers) for prefix in self.survey.prefixes}
        )

    def mtp_files(self) -> list[str]:
        """The files holding the counted MTP modules' tensors (packed formats have no `weight`)."""
        modules = self.modules()
        files = self.checkpoint.tensor_files
        return sorted({file for name, file in files.items() if name.rpartition(".")[0] in modules})

    def modules(self) -> dict[str, str]:
        """Every counted MTP module -> its on-disk format."""
        if self.survey is None:
            return {}
        stored = {name: self.checkpoint.tensors[f"{name}.weight"].dtype for name in self.survey.unquantized}
        return dict(sorted({**stored, **self.survey.quantized}.items()))


def diagnose(
    location: str | Path | CheckpointFiles,
    versions: list[str] | None = None,
    platform: str = "cuda",
    named: tuple[str, str] | None = None,
) -> Diagnosis:
    """Judge a local checkpoint directory, a Hub repository id or URL, or opened CheckpointFiles, for
    the given releases (default: every pinned one); named, (release, how it was named), comes first."""
    started = time.perf_counter()
    survey = load_survey()
    checkpoint = read_checkpoint(location)
    architecture = facts.architecture_of(checkpoint.config)
    declaration = declared_mtp_layers(checkpoint.config, architecture)
    layers = checkpoint.num_hidden_layers
    missing = {
        file: mtp
        for file, names in checkpoint.coverage.missing_files.items()
        if (mtp := [name for name in names if survey.is_mtp_tensor(name, layers)])
    }
    try:
        found = survey.survey_mtp_tensors(
            checkpoint.tensors,
            layers,
            declaration.count or 0,
            files=checkpoint.header_files,
            bytes_read=checkpoint.header_bytes,
            checkpoint_bytes=checkpoint.checkpoint_bytes,
            where=checkpoint.name,
        )
    except survey.MtpTensorsMissingError:
        found = None
    diagnosis = Diagnosis(checkpoint, architecture, declaration, found, missing, platform)
    pins = load_pins()
    versions = versions or list(pins)
    if named:
        diagnosis.named, diagnosis.named_by = named
        versions = [diagnosis.named, *(version for version in versions if version != diagnosis.named)]
    for version in versions:
        release = diagnosis.releases[version] = facts.Release.of(version, architecture, platform)
        diagnosis.verdicts[version] = {
            "stock": stock_verdict(diagnosis, release),
            "patched": patched_verdict(diagnosis, release, pins[version].series_dir),
        }
        diagnosis.fixes[version] = fixes(diagnosis, release)
        diagnosis.series[version] = pins[version].series_name
    diagnosis.seconds = time.perf_counter() - started
    return diagnosis


def layout_of(prefix: str, num_hidden_layers: int) -> str:
    """model.mtp_layers.0 -> model.mtp_layers.{i}.; model.layers.61 -> model.layers.{N+i}.; mtp -> mtp."""
    head, _, index = prefix.rpartition(".")
    if not index.isdecimal():
        return f"{prefix}."
    after_decoder = head.rpartition(".")[2] == "layers" and int(index) >= num_hidden_layers
    return f"{head}.{{N+i}}." if after_decoder else f"{head}.{{i}}."


def declared_mtp_layers(config: dict, architecture: facts.MtpArchitecture | None) -> Declaration:
    """How many MTP layers vLLM sees: the field in config.json (top level, then text_config), else
    the default of the config class vLLM builds."""
    if architecture and architecture.count_field is None:
        return Declaration(1, True, f"{architecture.name}: vLLM fixes the MTP layer count")
    fields = (
        [architecture.count_field] if architecture else ["num_nextn_predict_layers", "mtp_num_hidden_layers"]
    )
    for nested, holder in ((False, config), (True, text_config_of(config))):
        for name in fields:
            if name in holder:
                value = holder[name]
                where = f"config.json {'text_config.' if nested else ''}{name} = {value!r}"
                if value is not None and not (type(value) is int and value >= 0):
                    raise CheckpointError(f"{where}: not a count of MTP layers (an integer, 0 or more)")
                return Declaration(value if type(value) is int else None, True, where, name, nested)
    wanted = " or ".join(fields)
    if architecture is None or architecture.count_source is None:
        return Declaration(None, False, f"config.json has no {wanted}, and its default is not known here")
    default = architecture.missing_count
    return Declaration(
        default,
        True,
        f"config.json has no {wanted}; {architecture.count_source} "
        + ("sets none" if default is None else f"defaults it to {default}"),
        architecture.count_field,
        "text_config" in config,
    )


# --- the verdicts -----------------------------------------------------------------------------------


def stock_verdict(diagnosis: Diagnosis, release: facts.Release) -> Verdict:
    verdict = _stock_checkpoint_verdict(diagnosis, release)
    if verdict.kind in (WORKS, ZERO) and (failure := release.stock_platform_draft_step_fails):
        why = f"{verdict.why}; but {_platform_draft_step_fails(diagnosis, release)}"
        return Verdict(CRASH, why, failure)
    return verdict


def _platform_draft_step_fails(diagnosis: Diagnosis, release: facts.Release) -> str:
    version, platform = release.version, diagnosis.platform
    return f"stock vLLM {version} fails every MTP draft on {platform} at its first draft step"


def _stock_checkpoint_verdict(diagnosis: Diagnosis, release: facts.Release) -> Verdict:
    declaration, architecture = diagnosis.declaration, diagnosis.architecture
    if not declaration.known:
        return Verdict(UNKNOWN, declaration.source)
    if not declaration.count and not (declaration.count is None and release.stock_default_layers):
        # speculative.py divides by a count of 0; with no count at all, what happens is not known here.
        error = facts.STOCK_ZERO_MTP_LAYERS if declaration.count == 0 else None
        return Verdict(OFF, f"{declaration.source}: vLLM builds no MTP draft", error)
    if architecture is None:
        return Verdict(UNKNOWN, f"vLLM's MTP draft for {diagnosis.checkpoint.architecture} is not known here")
    if release.drafter_missing:
        return _no_drafter(architecture, release)
    if diagnosis.tensors_missing:
        verdict = _stock_without_tensors(diagnosis, release)
        if declaration.count is None:  # the drafter's own default, not the config, made the draft
            layers = release.stock_default_layers
            why = f"{declaration.source}, yet {architecture.name}'s drafter builds {layers} layer(s); "
            return Verdict(verdict.kind, why + verdict.why, verdict.error)
        return verdict
    return _misplaced_layers(diagnosis) or _draft_verdict(diagnosis, release, patched=False)


def _no_drafter(architecture: facts.MtpArchitecture, release: facts.Release) -> Verdict:
    newer = f"vLLM {architecture.first_release} has"
    return Verdict(CRASH, f"vLLM {release.version} has no {architecture.name} MTP drafter ({newer})")


def _misplaced_layers(diagnosis: Diagnosis) -> Verdict | None:
    expected = diagnosis.architecture and diagnosis.architecture.layout
    found = ", ".join(diagnosis.layouts())
    if expected and found != expected:
        return Verdict(
            UNKNOWN, f"MTP tensors under {found}; vLLM's {diagnosis.architecture.name} draft loads {expected}"
        )
    return None


def _stock_without_tensors(diagnosis: Diagnosis, release: facts.Release) -> Verdict:
    architecture, what = diagnosis.architecture, _missing_tensors(diagnosis)
    if diagnosis.missing_mtp and (refusal := release.stock_index_file_missing):
        return Verdict(CRASH, f"{what}; vLLM's weight loader refuses an index naming a missing file", refusal)
    loader = release.stock_missing_tensors
    if loader is None:
        return Verdict(UNKNOWN, f"{what}; what {architecture.name}'s MTP loader then does is not known here")
    if loader != facts.RANDOM_WEIGHTS:
        why = f"{what}; {architecture.name}'s MTP loader wants every draft parameter"
        return Verdict(CRASH, why, loader)
    random_part = (
        "the missing layers get random weights"
        if diagnosis.layers_missing
        else "the draft's weights are random"
    )
    random = Verdict(ZERO, f"{what}; {random_part}")
    return _experts_without_kernel(diagnosis, release) or random


def _experts_without_kernel(diagnosis: Diagnosis, release: facts.Release) -> Verdict | None:
    """The draft's routed experts, which the checkpoint's scheme quantizes, on a platform without an
    MoE kernel for that scheme: building the draft fails, whatever its tensors."""
    architecture, checkpoint = diagnosis.architecture, diagnosis.checkpoint
    if architecture.draft_experts is None or checkpoint.quantization is None:
        return None
    experts = architecture.draft_experts.format(layer=checkpoint.num_hidden_layers)
    expert = f"{experts}.{_EXPERT_SHARDS[0]}"
    if (
        _ignored(checkpoint, expert, release, architecture) is not False
        or (scheme := _targeting_group(checkpoint, expert)) is None
    ):
        return None
    _, fmt = facts.quantization_format(checkpoint.quantization, scheme)
    if error := release.moe_kernel_missing.get(fmt):
        return Verdict(
            CRASH,
            f"the draft's {experts} is built {fmt}, which {diagnosis.platform} has no MoE kernel for",
            error,
        )
    return None


def patched_verdict(diagnosis: Diagnosis, release: facts.Release, series_dir: Path) -> Verdict:
    """vLLM of this release with the series serving it: that series' own start-up check and draft
    quantization decision, run on the checkpoint."""
    survey = series_survey(series_dir)
    checkpoint, declaration = diagnosis.checkpoint, diagnosis.declaration
    if not declaration.known:
        return Verdict(UNKNOWN, declaration.source)
    if not declaration.count:
        refusal = facts.PATCHED_NO_MTP_LAYERS.format(model=checkpoint.name)
        return Verdict(OFF, f"{declaration.source}: vLLM builds no MTP draft", refusal)
    if diagnosis.architecture is None:
        return Verdict(UNKNOWN, f"vLLM's MTP draft for {checkpoint.architecture} is not known here")
    if release.drafter_missing:
        return _no_drafter(diagnosis.architecture, release)
    if diagnosis.tensors_missing:
        # The series' own start-up check, on the same survey: its words are the refusal's. The files
        # it reads are chosen by the newest series' module, whose errors are caught too.
        newest = load_survey()
        refusals = (
            survey.MtpTensorsMissingError,
            newest.MtpTensorsMissingError,
            newest.CheckpointHeaderError,
        )
        try:
            checkpoint.files.survey_at_start_up(survey, checkpoint, declaration.count)
        except refusals as error:
            return Verdict(
                CRASH, f"start-up refuses: {_missing_tensors(diagnosis)}", facts.PATCHED_PREFIX + str(error)
            )
        if diagnosis.layers_missing:  # the start-up check counts no layers; loud loading names them
            return Verdict(CRASH, f"loud loading: {_missing_tensors(diagnosis)}", facts.PATCHED_UNLOADED)
        return Verdict(UNKNOWN, f"{_missing_tensors(diagnosis)}, yet the series' start-up check finds them")
    if misplaced := _misplaced_layers(diagnosis):
        return misplaced
    if checkpoint.quantization is None:
        return _draft_verdict(diagnosis, release, patched=True)
    # A series that refuses an MTP layer quantized around a BF16 decoder block says so (v0.33.0);
    # one that builds the two with their own quant configs decides per part (v0.22.1: `block`).
    refused = getattr(survey, "MixedMtpQuantizationError", ())
    found = diagnosis.survey  # re-made in the series' module, whose properties its decision reads
    found = survey.MtpSurvey(**{item.name: getattr(found, item.name) for item in fields(survey.MtpSurvey)})
    try:
        decision = survey.decide_draft_quantization(found)
    except refused as error:
        return Verdict(CRASH, "draft_quant_config 'auto' refuses the mixed layout", str(error))
    if (
        getattr(decision, "block", None) == "unquantized"
        or getattr(decision, "quant_config", None) == "unquantized"
    ):
        return Verdict(WORKS, f"draft_quant_config 'auto': {decision.summary}")
    # A series that refuses, while loading, a tensor its draft parameter would cast (0004) stops on a
    # quantized MTP module the config builds in a scheme that cannot load it.
    if release.series_refuses_casts:
        config_file = f"{checkpoint.name}/config.json"
        try:
            schemes.check_mtp_quant_schemes(
                found.quantized, checkpoint.tensors, checkpoint.quantization, found.files, config_file
            )
        except schemes.MtpQuantSchemeError as error:
            why = "loading refuses the MTP layer the config builds in another format"
            return Verdict(CRASH, why, str(error))
        except CONFIG_REFUSALS as error:
            return _unreadable_config(error)
    return _draft_verdict(diagnosis, release, patched=True)


# What the config classes raise for a quantization_config they cannot read (a field missing), as vLLM
# does at start-up.
CONFIG_REFUSALS = (KeyError, ValueError, TypeError, AttributeError)


def _unreadable_config(error: Exception) -> Verdict:
    return Verdict(
        CRASH, "vLLM cannot read the checkpoint's quantization_config", f"{type(error).__name__}: {error}"
    )


def _draft_verdict(diagnosis: Diagnosis, release: facts.Release, patched: bool) -> Verdict:
    """The draft built with the checkpoint's quantization config: stock vLLM always builds it so, the
    series when the MTP tensors are quantized ('target'). Crashes come in the order vLLM meets them:
    building the draft, loading its tensors, checking what loaded."""
    checkpoint, architecture = diagnosis.checkpoint, diagnosis.architecture
    if checkpoint.quantization is None:
        if diagnosis.survey.quantized:
            return Verdict(UNKNOWN, "quantized MTP tensors, no quantization config")
        return Verdict(WORKS, "nothing is quantized")
    try:
        modules = draft_modules(diagnosis, release)
    except CONFIG_REFUSALS as error:
        return _unreadable_config(error)
    if unknown := [module for module in modules if module.built == "unknown"]:
        return Verdict(UNKNOWN, f"{unknown[0].name}: {unknown[0].note}")
    label = scheme_label(checkpoint.quantization)
    crashes: list[Verdict] = []
    if mixed := [module.runtime for module in modules if module.built == "mixed"]:
        crashes.append(
            Verdict(
                CRASH,
                f"the ignore entries cover only some shards of {_first(mixed)}",
                "different quantization schemes",
            )
        )
    keeps_own_scheme = patched and release.series_keeps_mtp_own_scheme
    shards_before_class = patched or release.shard_names_before_class
    mixed_precision, gptq_builds = diagnosis.mixed_precision, diagnosis.gptq_builds
    if not keeps_own_scheme and (
        missed := [
            schemes.runtime_layer(module.runtime)
            for module in modules
            if _own_group_missed(checkpoint, module, shards_before_class, mixed_precision, gptq_builds)
        ]
    ):
        if mixed_precision:
            by = (
                "by another quantized_layers entry than the checkpoint names the MTP layer's by (none: "
                "unquantized)"
            )
        elif checkpoint.quantization.get("quant_method") == "gptq":
            by = "by other GPTQ rules (dynamic, quantized modules) than the checkpoint's names of it take"
        else:
            by = "in another config group than the checkpoint names the MTP layer's own by"
        why = f"the draft builds {_first(missed)} {by}: its tensors do not fit"
        crashes.append(Verdict(CRASH, why))
    casts, misfits, kernel_gaps = [], [], {}
    for module in modules:
        if module.built != "quantized" or module.stored not in facts.FLOAT_DTYPES:
            continue
        layer = schemes.runtime_layer(module.runtime)
        method, fmt = facts.quantization_format(
            checkpoint.quantization, _targeting_group(checkpoint, module.runtime)
        )
        if schemes.EXPERT.match(module.runtime) and (gap := release.moe_kernel_missing.get(fmt)):
            kernel_gaps[layer] = Verdict(
                CRASH, f"the draft's {layer} is built {fmt}: no {diagnosis.platform} MoE kernel", gap
            )
        consequence = facts.BF16_INTO_QUANTIZED_DRAFT.get((method, fmt))
        if consequence is None:
            return Verdict(
                UNKNOWN,
                f"what a {method} {fmt or ''} draft does with the BF16 {module.name} is not known here",
            )
        (casts if consequence == facts.CAST else misfits).append(layer)
    crashes[:0] = kernel_gaps.values()
    if misfits:
        crashes.append(
            Verdict(CRASH, f"the draft builds {_first(misfits)} {label}: the BF16 tensors do not fit")
        )
    refusals = {} if patched else release.stock_loader_refuses
    if refusal := refusals.get(checkpoint.quantization.get("quant_method")):
        crashes.append(
            Verdict(CRASH, f"{architecture.name}'s MTP loader refuses {label} checkpoints", refusal)
        )
    if not patched and (failure := release.stock_draft_step_fails):
        crashes.append(
            Verdict(CRASH, f"{architecture.name}'s stock MTP draft fails at its first draft step", failure)
        )
    if casts and patched:
        why = f"loud loading: {_first(casts)} built {label} get no scales from the BF16 tensors"
        crashes.append(Verdict(CRASH, why, facts.PATCHED_UNLOADED))
    if crashes:
        # vLLM raises the first: its words, where known, are what the user sees.
        return Verdict(CRASH, "; ".join(crash.why for crash in crashes), crashes[0].error)
    if casts:
        return Verdict(
            ZERO, f"the draft builds {_first(casts)} {label}: BF16 weights are cast in, scales never load"
        )
    return Verdict(WORKS, "every draft module is built as its tensors are stored")


def _module_kind(name: str) -> str:
    """A module's own name, its index dropped: model.layers.2.eh_proj, model.mtp_linear_proj.0 -> eh_proj,
    mtp_linear_proj."""
    return name.rstrip("0123456789.").rpartition(".")[2]


def draft_modules(diagnosis: Diagnosis, release: facts.Release) -> list[DraftModule]:
    """The checkpoint's MTP modules as the stock draft of a release builds them."""
    checkpoint, architecture = diagnosis.checkpoint, diagnosis.architecture
    naming = release.draft_name
    _, entries = checkpoint.ignore_entries()
    compressed_tensors = checkpoint.quantization.get("quant_method") == "compressed-tensors"
    mixed_precision, gptq_builds = diagnosis.mixed_precision, diagnosis.gptq_builds
    modules = []
    for name, stored in diagnosis.modules().items():
        if architecture and _module_kind(name) in architecture.plain_linears:
            modules.append(DraftModule(name, stored, None, "unquantized", "outside the quant config"))
            continue
        if naming is None:
            note = f"how vLLM {release.version}'s draft builds it is not known here"
            modules.append(DraftModule(name, stored, None, "unknown", note))
            continue
        runtime = naming(name, checkpoint.num_hidden_layers)
        if mixed_precision is not None:
            built = "quantized" if _entry_algo(mixed_precision, runtime) else "unquantized"
            modules.append(DraftModule(name, stored, runtime, built))
        elif gptq_builds is not None:
            built = "quantized" if gptq_builds(runtime)[0] else "unquantized"
            modules.append(DraftModule(name, stored, runtime, built))
        elif not compressed_tensors and entries:
            note = (
                f"matching {checkpoint.quantization.get('quant_method')} entries to the draft is not modelled"
            )
            modules.append(DraftModule(name, stored, runtime, "unknown", note))
        elif not compressed_tensors:
            modules.append(DraftModule(name, stored, runtime, "quantized"))
        else:
            ignored = _ignored(checkpoint, runtime, release, architecture)
            if ignored is None:
                modules.append(DraftModule(name, stored, runtime, "mixed"))
            else:
                targeted = not ignored and _targeting_group(checkpoint, runtime) is not None
                modules.append(DraftModule(name, stored, runtime, "quantized" if targeted else "unquantized"))
    return modules


# --- compressed-tensors' matching, as vLLM does it ---------------------------------------------------


def _shards(runtime: str) -> list[str]:
    """The names vLLM matches a runtime module through: every shard of its fused layer."""
    if expert := schemes.EXPERT.match(runtime):
        return [f"{expert['experts']}.{shard}" for shard in _EXPERT_SHARDS]
    parent, _, leaf = runtime.rpartition(".")
    for _, shards in schemes.FUSED_LINEARS:
        if leaf in shards:
            return [f"{parent}.{shard}" for shard in shards]
    return [runtime]


def _matches(name: str, entry: str) -> bool:
    return matching.is_equal_or_regex_match(name, entry)


def _matches_any(name: str, entries: list[str]) -> bool:
    return any(_matches(name, entry) for entry in entries)


def _ignored(
    checkpoint: Checkpoint,
    runtime: str,
    release: facts.Release,
    architecture: facts.MtpArchitecture | None = None,
) -> bool | None:
    """Whether `ignore` (as the architecture's target renames it) covers the module, as vLLM's
    should_ignore_layer decides: an entry for its fused linear's own name ignores it
    (facts.IGNORE_BY_FUSED_NAME); else its shards, all, none, or None for some (vLLM refuses that). An
    expert layer is decided by expert 0's projections."""
    _, entries = checkpoint.ignore_entries()
    if architecture:
        entries = architecture.renamed_ignore(entries)
    layer = schemes.runtime_layer(runtime)
    by_name = release.ignore_by_fused_name
    if not schemes.EXPERT.match(runtime) and (
        layer in entries or (by_name == "matched" and _matches_any(layer, entries))
    ):
        return True
    found = {_matches_any(shard, entries) for shard in _shards(runtime)}
    return found.pop() if len(found) == 1 else None


def _targeting_group(checkpoint: Checkpoint, runtime: str, shards_before_class: bool = True) -> dict | None:
    """The config group whose targets take the module, as vLLM's find_matched_target decides: a target
    naming its (fused) linear, then each of its shards, then the class name "Linear" (every linear, and
    the fused experts vLLM adds for it); the class before the shards where `shards_before_class` is
    False (facts.SHARD_NAMES_BEFORE_CLASS). An expert layer is decided by expert 0's gate_proj."""
    layer, shards = schemes.runtime_layer(runtime), _shards(runtime)
    if schemes.EXPERT.match(runtime):
        layer, shards = shards[0], shards[:1]
    groups = list((checkpoint.quantization.get("config_groups") or {}).values())

    def targets(group: dict) -> list[str]:
        return group.get("targets") or []

    by_name = (group for group in groups if _matches_any(layer, targets(group)))
    by_shards = (group for group in groups if all(_matches_any(shard, targets(group)) for shard in shards))
    by_class = (group for group in groups if "Linear" in targets(group))
    ranked = (by_name, by_shards, by_class) if shards_before_class else (by_name, by_class, by_shards)
    return next((group for candidates in ranked for group in candidates), None)


# --- ModelOpt mixed precision's matching, as vLLM does it ---------------------------------------------


def _entry_algo(config: matching._ModelOptConfig, name: str) -> str | None:
    """The quant_algo a ModelOpt mixed-precision config builds a module of this name in; None:
    unquantized (excluded, or without an entry)."""
    return None if config.is_layer_excluded(name) else config._resolve_quant_algo(name)


def _own_group_missed(
    checkpoint: Checkpoint,
    module: DraftModule,
    shards_before_class: bool,
    mixed_precision: matching._ModelOptConfig | None,
    gptq_builds: schemes.GptqBuilds | None,
) -> bool:
    """A quantized MTP module whose config group (ModelOpt mixed precision, the checkpoint's
    `mixed_precision` config: quantized_layers entry) by its checkpoint name is not the one its draft
    name takes: the draft builds it in another scheme than its tensors are stored in."""
    # A module built outside the quant config (runtime None) takes no scheme by name.
    if module.stored in facts.FLOAT_DTYPES or module.runtime is None:
        return False
    if gptq_builds is not None:
        return gptq_builds(module.name)[0] != gptq_builds(module.runtime)[0]
    if mixed_precision is not None:
        return _entry_algo(mixed_precision, module.name) != _entry_algo(mixed_precision, module.runtime)
    if module.built != "quantized":
        return False
    own = _targeting_group(checkpoint, module.name)
    return own is not None and own is not _targeting_group(checkpoint, module.runtime, shards_before_class)


def scheme_label(quantization: dict) -> str:
    method, fmt = facts.quantization_format(quantization)
    return f"{method} {fmt}" if fmt else str(method)


# --- fixes ------------------------------------------------------------------------------------------


def fixes(diagnosis: Diagnosis, release: facts.Release) -> list[str]:
    version = release.version
    stock, patched = diagnosis.verdicts[version]["stock"], diagnosis.verdicts[version]["patched"]
    if stock.kind == WORKS:
        return []
    if release.drafter_missing:
        return [f"serve it with vLLM {diagnosis.architecture.first_release} or newer"]
    declaration = diagnosis.declaration
    where = "text_config" if declaration.nested else "config.json"
    if (
        diagnosis.survey is not None
        and not diagnosis.missing_mtp
        and not declaration.count
        and declaration.field
    ):
        declare = f"declare the MTP layers: {declaration.field}: {len(diagnosis.stored_layers())} in {where}"
        return [declare + _dropped(diagnosis)]
    if diagnosis.layers_missing:  # graft adds no layer to a checkpoint that has MTP tensors
        stored, files = diagnosis.stored_layers(), ", ".join(diagnosis.mtp_files())
        return [
            f"declare the MTP layers the checkpoint stores: {declaration.field}: {len(stored)} in {where} "
            f"({files} holds {', '.join(stored) or 'none'}), or add the missing layers' tensors"
        ]
    if diagnosis.tensors_missing or not declaration.count:
        graft = "graft --mtp-from <the BF16 release>: adds its MTP tensors and config fields"
        return [graft + _dropped(diagnosis)]
    found = []
    if patched.kind == WORKS:
        found.append(
            f"vLLM {version} with the mtpq series (apply.py --installed or --wheel, or the images): "
            "draft_quant_config 'auto' (the default)"
        )
        if not diagnosis.survey.quantized and release.online_draft_quantization:
            found.append(
                "optional, for the BF16 draft's memory and step time at some acceptance: draft_quant_config "
                '{"online": "fp8_per_block"} or another of vLLM\'s online schemes (or {"online_config": '
                '{"linear": ...}}); refused at start-up where the platform lacks its kernels'
            )
        entries, _ = stock_ignore_entries(diagnosis, release)
        if entries:
            found.append(
                f"for stock vLLM {version}: add {len(entries)} ignore entries under the names its draft "
                f"builds: {_first(entries)}"
            )
    return found


def _dropped(diagnosis: Diagnosis) -> str:
    """What the architecture's releases have and this checkpoint lacks: their MTP file and keys."""
    architecture, checkpoint = diagnosis.architecture, diagnosis.checkpoint
    if architecture is None or architecture.release_mtp_file is None:
        return ""
    holder = text_config_of(checkpoint.config) if "text_config" in checkpoint.config else checkpoint.config
    where = "text_config." if "text_config" in checkpoint.config else ""
    missing = [f"{where}{key}" for key in architecture.release_mtp_keys if key not in holder]
    lacking = [] if diagnosis.survey else [f"{architecture.release_mtp_file} (its releases' MTP file)"]
    return f" (missing here: {', '.join(lacking + missing)})" if lacking or missing else ""


def stock_ignore_entries(diagnosis: Diagnosis, release: facts.Release) -> tuple[list[str], str]:
    """The compressed-tensors ignore entries that keep stock vLLM's draft of this release unquantized
    where the checkpoint is BF16, or ([], why that alone cannot make stock vLLM work)."""
    checkpoint, architecture, version = diagnosis.checkpoint, diagnosis.architecture, release.version
    quantization = checkpoint.quantization or {}
    if quantization.get("quant_method") != "compressed-tensors":
        return [], f"only compressed-tensors ignore lists are written, not {scheme_label(quantization)}"
    if architecture is None or release.draft_name is None:
        return [], f"the names vLLM {version}'s draft builds its modules under are not known here"
    if release.stock_draft_step_fails:
        return [], f"stock vLLM {version}'s {architecture.name} MTP draft fails at its first draft step"
    if release.stock_platform_draft_step_fails:
        return [], _platform_draft_step_fails(diagnosis, release)
    if "compressed-tensors" in release.stock_loader_refuses:
        loader = f"stock vLLM {version}'s {architecture.name} MTP loader"
        return [], f"{loader} refuses every compressed-tensors checkpoint"
    modules = draft_modules(diagnosis, release)
    entries = [m.runtime for m in modules if m.built != "unquantized" and m.stored in facts.FLOAT_DTYPES]
    if renamed := [entry for entry in entries if entry not in architecture.renamed_ignore([entry])]:
        return [], f"the target's weights mapper renames an entry {renamed[0]} before it reaches the draft"
    main_modules = {name.rpartition(".")[0] for name in checkpoint.tensor_names}
    if clash := [entry for entry in entries if entry in main_modules and entry not in diagnosis.modules()]:
        return [], f"{clash[0]} is also a module of the main model: ignoring it would unquantize that"
    return entries, ""


def _missing_tensors(diagnosis: Diagnosis) -> str:
    if diagnosis.layers_missing:
        stored = diagnosis.stored_layers()
        return (
            f"{diagnosis.declaration.source} declares {diagnosis.declaration.count} MTP layers; "
            f"{', '.join(diagnosis.mtp_files())} holds {len(stored)}: {', '.join(stored) or 'none'}"
        )
    if diagnosis.missing_mtp:
        file, names = next(iter(diagnosis.missing_mtp.items()))
        return f"the index maps {len(names)} MTP tensors (e.g. {names[0]}) to {file}, which is missing"
    return "the checkpoint holds no MTP tensor"


def _first(names, limit: int = 3) -> str:
    names = list(dict.fromkeys(names))
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
