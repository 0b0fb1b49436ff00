"""The MTP drafters of a vLLM release, read from its source tree without importing vLLM (so a release
with no CPU engine, 0.33.0, is read too).

* which drafters: the keys of ``_SPECULATIVE_DECODING_MODELS`` in vllm/model_executor/models/registry.py
  that contain "MTP" and are not EAGLE's (``drafter_keys``); never a hand-kept list;
* which target configs vLLM turns into each (``SpeculativeConfig.hf_config_override`` in
  vllm/config/speculative.py, run on stand-in configs: ``drafter_targets``);
* the file that defines each drafter class, and how that file gets the draft's quantization config
  (``quant_source``): from ``vllm_config.quant_config`` or ``get_draft_quant_config`` (both carry the
  series' draft_quant_config decision, patch 0002), or by its own logic, which bypasses it.

A tree is read through ``read(path) -> text or None``: a directory (``directory_reader``) or a git
revision of a pinned tree (``revision_reader``), e.g. a release with its series applied.
"""

from __future__ import annotations

import ast
import builtins
import copy
import json
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtpq.core import crashsafe, gittree
from mtpq.core.errors import MtpqError
from mtpq.core.package_data import package_path
from mtpq.core.pin import version_key
from mtpq.core.series import load_series

REGISTRY = "vllm/model_executor/models/registry.py"
SPECULATIVE_CONFIG = "vllm/config/speculative.py"
_MODEL_PACKAGES = "vllm/model_executor/models"

# How a drafter gets its quantization config.
FROM_VLLM_CONFIG = "vllm_config.quant_config"
FROM_DRAFT_HELPER = "get_draft_quant_config"
OWN_LOGIC = "own logic"
DEFERS = "own logic, deferring to draft_quant_config"
# The series' guard: a drafter's own quantization rule applies only when draft_quant_config leaves the
# draft the target's quantization.
_DEFER_GUARD = "mtp_draft_has_own_quant_config"
# Names that read a checkpoint's quantization settings from its HF config: a drafter that reads them
# decides its quantization itself (Qwen3.5's GPTQ `dynamic` entries, LongCat's disable_quant_module,
# Hunyuan V4's mtp_quant_algo and ignored_layers).
_CHECKPOINT_QUANT_FIELDS = ("quantization_config", "disable_quant_module", "mtp_quant_algo")

# Platform subpackages of vllm/models/<family>/ that CUDA does not import.
_OTHER_PLATFORMS = frozenset({"amd", "xpu", "cpu", "rocm", "tpu"})

Reader = Callable[[str], str | None]


class DrafterSourceError(MtpqError, ValueError):
    """The tree does not have what the reader expects (names the file and what is missing)."""


@dataclass(frozen=True)
class Drafter:
    key: str  # the registry key, the draft config's architecture
    class_name: str
    model_file: str  # the file defining the class, relative to the tree
    targets: tuple[str, ...]  # model_types / architectures hf_config_override turns into this drafter
    quant_source: str  # FROM_VLLM_CONFIG, FROM_DRAFT_HELPER, OWN_LOGIC or DEFERS
    own_logic: tuple[str, ...] = ()  # what the own logic reads or does (OWN_LOGIC, DEFERS)


def directory_reader(root: Path) -> Reader:
    """Files of a tree on disk (``root`` holds ``vllm/``)."""

    def read(path: str) -> str | None:
        file = root / path
        return file.read_text(encoding="utf-8") if file.is_file() else None

    return read


def revision_reader(repo, revision: str) -> Reader:
    """Files of a git revision of a pinned tree (mtpq.core.gittree.Repo)."""

    def read(path: str) -> str | None:
        data = repo.blob(revision, path)
        return None if data is None else data.decode("utf-8")

    return read


def _source(read: Reader, path: str) -> str:
    text = read(path)
    if text is None:
        raise DrafterSourceError(f"{path}: not in the tree")
    return text


def is_mtp_drafter(key: str) -> bool:
    return "MTP" in key and "eagle" not in key.lower()


def speculative_models(registry_source: str) -> dict[str, tuple[str, str]]:
    """``_SPECULATIVE_DECODING_MODELS`` of a registry.py: key -> (module, class name)."""
    for node in ast.parse(registry_source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "_SPECULATIVE_DECODING_MODELS"
            for target in node.targets
        ):
            return ast.literal_eval(node.value)
    raise DrafterSourceError(f"{REGISTRY}: no _SPECULATIVE_DECODING_MODELS assignment")


def drafter_keys(read: Reader) -> list[str]:
    """The registry's MTP drafter keys, in registry order."""
    return [key for key in speculative_models(_source(read, REGISTRY)) if is_mtp_drafter(key)]


def _module_file(read: Reader, module: str) -> str:
    """The file of a registry module: a bare name lives in vllm/model_executor/models."""
    dotted = module if "." in module else f"{_MODEL_PACKAGES.replace('/', '.')}.{module}"
    base = dotted.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if read(candidate) is not None:
            return candidate
    raise DrafterSourceError(f"{REGISTRY}: module {module} is neither {base}.py nor {base}/__init__.py")


def _imported_from(path: str, node: ast.ImportFrom) -> str:
    """The module an ImportFrom in ``path`` names, dotted."""
    if not node.level:
        return node.module or ""
    package = path.split("/")[:-1]
    package = package[: len(package) - node.level + 1]
    return ".".join([*package, *([node.module] if node.module else [])])


def defining_file(read: Reader, module: str, class_name: str) -> str:
    """The file whose source defines ``class_name``, following a package's re-exports as CUDA
    platforms resolve them: the first import of the name from no other platform's subpackage."""
    path = _module_file(read, module)
    for _ in range(8):
        tree = ast.parse(_source(read, path))
        if any(isinstance(node, ast.ClassDef) and node.name == class_name for node in tree.body):
            return path
        imports = sorted(
            (
                node
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and any(alias.name == class_name for alias in node.names)
            ),
            key=lambda node: node.lineno,
        )
        modules = [_imported_from(path, node) for node in imports]
        if not modules:
            raise DrafterSourceError(f"{path}: neither defines nor imports {class_name}")
        cuda = [module for module in modules if _OTHER_PLATFORMS.isdisjoint(module.split("."))]
        path = _module_file(read, (cuda or modules)[0])
    raise DrafterSourceError(f"{module}.{class_name}: re-exported too many times")


def quant_source(model_source: str) -> tuple[str, tuple[str, ...]]:
    """How a drafter's model file gets the draft's quantization config, and (own logic) what it does
    besides: reads the checkpoint's quantization settings, replaces vllm_config.quant_config with
    anything but get_draft_quant_config's result, or rebuilds vllm_config around another model_config
    (``replace(vllm_config, model_config=...)`` derives the quant config from the checkpoint again).
    Own logic guarded by the series' _DEFER_GUARD defers to the decision."""
    tree = ast.parse(model_source)
    from_helper = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", getattr(node.value.func, "attr", None)) == FROM_DRAFT_HELPER
        ):
            from_helper |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    # A rebuilt vllm_config that is then given get_draft_quant_config's result keeps the decision.
    helper_reassigned = any(
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Name)
        and node.value.id in from_helper
        and any(
            isinstance(target, ast.Attribute) and target.attr == "quant_config" for target in node.targets
        )
        for node in ast.walk(tree)
    )
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in _CHECKPOINT_QUANT_FIELDS:
            own.add(f"reads {node.value}")
        elif isinstance(node, ast.Attribute) and node.attr in _CHECKPOINT_QUANT_FIELDS:
            own.add(f"reads {node.attr}")
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Attribute)
            and target.attr == "quant_config"
            and getattr(target.value, "id", None) == "vllm_config"
            for target in node.targets
        ):
            if not (isinstance(node.value, ast.Name) and node.value.id in from_helper):
                own.add("replaces vllm_config.quant_config")
        elif (
            not helper_reassigned
            and isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "replace"
            and any(keyword.arg == "model_config" for keyword in node.keywords)
        ):
            own.add("replace(vllm_config, model_config=...) re-derives the quant config")
    names = {getattr(node, "id", getattr(node, "attr", None)) for node in ast.walk(tree)}
    if own:
        return (DEFERS if _DEFER_GUARD in names else OWN_LOGIC), tuple(sorted(own))
    if FROM_DRAFT_HELPER in names:
        return FROM_DRAFT_HELPER, ()
    return FROM_VLLM_CONFIG, ()


class _StandInConfig:
    """A target config as hf_config_override reads it: ``name`` as both its model_type and its
    architecture, one MTP layer under every field a branch counts them by, itself as its
    text_config and decoder."""

    def __init__(self, name: str) -> None:
        self.model_type = name
        self.architectures = [name]
        self.layer_types: list[str] = []
        self.mtp_config = {"num_nextn_predict_layers": 1}
        # Nemotron Parse's draft needs its decoder's causal vision prefix.
        self.causal_vision_prefix = True
        for field in (
            "num_nextn_predict_layers",
            "mtp_num_hidden_layers",
            "num_mtp_modules",
            "hc_count",
            "mtp_num_experts",
            "mtp_num_experts_per_tok",
        ):
            setattr(self, field, 1)

    @property
    def text_config(self) -> _StandInConfig:
        return self

    @property
    def decoder(self) -> _StandInConfig:
        return self

    def get_text_config(self) -> _StandInConfig:
        return self

    def update(self, values: dict) -> None:
        self.__dict__.update(values)


class _AnyModule(types.ModuleType):
    """A vLLM module imported inside hf_config_override: every name is 1 (a layer count)."""

    def __getattr__(self, name: str) -> int:
        return 1


def _import_without_vllm(name, *args, **kwargs):
    if name == "vllm" or name.startswith("vllm."):
        return _AnyModule(name)
    return builtins.__import__(name, *args, **kwargs)


def _hf_config_override(speculative_source: str) -> Callable[[_StandInConfig], object]:
    """SpeculativeConfig.hf_config_override compiled on its own, its vLLM imports stood in for."""
    for node in ast.walk(ast.parse(speculative_source)):
        if isinstance(node, ast.FunctionDef) and node.name == "hf_config_override":
            function = node
            break
    else:
        raise DrafterSourceError(f"{SPECULATIVE_CONFIG}: no hf_config_override")
    function.decorator_list = []
    function.returns = None
    for argument in function.args.args:
        argument.annotation = None
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace = {
        "__builtins__": {**vars(builtins), "__import__": _import_without_vllm},
        "copy": copy,
        "get_hf_text_config": lambda config: config.get_text_config(),
    }
    exec(compile(module, SPECULATIVE_CONFIG, "exec"), namespace)
    return namespace["hf_config_override"]


def drafter_targets(read: Reader, keys: list[str]) -> dict[str, tuple[str, ...]]:
    """For each drafter key, the model_types and architectures (string constants of
    hf_config_override) whose config hf_config_override turns into that drafter's."""
    source = _source(read, SPECULATIVE_CONFIG)
    override = _hf_config_override(source)
    function = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "hf_config_override"
    )
    names = sorted(
        {
            node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
    )
    targets: dict[str, list[str]] = {key: [] for key in keys}
    for name in names:
        try:
            result = override(_StandInConfig(name))
        # A branch that refuses this stand-in (e.g. a name it does not handle) maps nothing.
        except Exception:  # noqa: BLE001
            continue
        architecture = (getattr(result, "architectures", None) or [None])[0]
        if architecture in targets and architecture != name:
            targets[architecture].append(name)
    return {key: tuple(found) for key, found in targets.items()}


def read_drafters(read: Reader) -> list[Drafter]:
    """Every MTP drafter of the tree, in registry order."""
    models = speculative_models(_source(read, REGISTRY))
    keys = [key for key in models if is_mtp_drafter(key)]
    targets = drafter_targets(read, keys)
    drafters = []
    for key in keys:
        module, class_name = models[key]
        path = defining_file(read, module, class_name)
        source, own = quant_source(_source(read, path))
        drafters.append(Drafter(key, class_name, path, targets[key], source, own))
    return drafters


# The support matrix: a row per drafter of a release, from its tree and the construction probe's record
# (tests/test_drafter_matrix.py checks the record against the probe and README.md against the table).
RECORD = package_path("mtpq.upstream", "drafter_matrix.json")
UNQUANTIZED = "unquantized"
QUANTIZED = "quantized"
NOT_BUILT = "not built"
STATIC_ONLY = "static only"
RECOGNISED = "all recognised by `auto`"
NOT_RECOGNISED = "not recognised by `auto`:"
DRAFTER_NAMED_ERROR = "error naming the drafter and the tensor"
NAMED_ERROR = "error naming the tensor"
UNNAMED_ERROR = "error naming no tensor"
LOADS_SILENTLY = "loads without error"
OWN_SCHEME = "own scheme (FP8 block)"
TARGET_SCHEME = "target's scheme (INT8): the MTP layer's group matches no draft layer"
FP8_TENSORS_LOAD = "its FP8 tensors:"
# The other scheme pairs the probe builds (MTP layer / target), by what the description of a layer in
# the MTP layer's scheme reads.
OWN_SCHEME_MARKERS = {
    "W4A16 / INT8": "WNA16",
    "INT8 / W4A16": "Int8",
    "GPTQ INT4 / GPTQ INT8": "int4",
    "FP8 / NVFP4 ModelOpt": "float8_e4m3fn",
}
OWN_SCHEME_EVERY_PAIR = "own scheme in every pair"
_QUANT_SOURCE_WORDS = {
    FROM_VLLM_CONFIG: "`vllm_config.quant_config`",
    FROM_DRAFT_HELPER: "`get_draft_quant_config`",
    OWN_LOGIC: "own logic, bypassing the decision",
    DEFERS: "own logic, deferring to the decision",
}


class DrafterMatrixError(MtpqError, ValueError):
    """A release's registry lists a drafter its record does not cover, or the record is unreadable."""


def outcome(run: dict) -> str:
    """One probe row (tests/probes/drafter_matrix.py) as the matrix states it: UNQUANTIZED, QUANTIZED
    (some linear or MoE layer takes a quant method; KV-cache methods aside), or why it was not built."""
    failed = run.get("config") or run.get("build")
    if failed is not None:
        message = " ".join(failed["error"].split()).split(" [type=")[0]
        return f"{NOT_BUILT}: {failed['error_type']}: {message[:160]}"
    methods = {method for method in run["linears"].values() if "KVCache" not in method}
    quantized = {
        method for method in methods if not method.startswith("Unquantized") and method != "torch.nn.Linear"
    }
    return QUANTIZED if quantized else UNQUANTIZED


def naming_outcome(run: dict, is_mtp_tensor: Callable[[str, int], bool]) -> str:
    """The on-disk MTP namings the drafter's own loader accepts, of those the probe tries (its draft
    parameter's name under each MTP prefix checkpoints use), and whether ``draft_quant_config="auto"``
    (``is_mtp_tensor``, the series' header survey) takes each for an MTP tensor."""
    if "namings" not in run:
        return "—"
    accepted = [(root, rest) for naming in run["namings"].values() for root, rest in naming["accepted"]]
    if not accepted:
        return "none of the namings tried"
    roots = ", ".join(f"`{root}*`" for root in sorted({root for root, _ in accepted}))
    missed = [root + rest for root, rest in accepted if not is_mtp_tensor(root + rest, run["hidden_layers"])]
    return f"{roots}: " + (f"{NOT_RECOGNISED} {', '.join(missed)}" if missed else RECOGNISED)


def _load_outcome(found: dict) -> str:
    """An error naming the draft parameter or checkpoint tensor at fault (and the drafter class), an
    error naming none, or no error."""
    if "error" not in found:
        return LOADS_SILENTLY
    named = (
        (DRAFTER_NAMED_ERROR if found["drafter_named"] else NAMED_ERROR) if found["names"] else UNNAMED_ERROR
    )
    return f"{named} ({found['error_type']})"


def bad_load_outcome(run: dict, case: str) -> str:
    """How the draft loads a bad checkpoint (``case``: "missing", one MTP tensor and none of the
    others; "wrong_shape", that tensor with 16 rows too many)."""
    found = run.get("bad_loads", {}).get(case)
    return "—" if found is None else _load_outcome(found)


def own_scheme_outcome(run: dict) -> str:
    """The draft of a checkpoint whose MTP layer is FP8-block quantized under a config group of its own
    (targets naming the MTP layer as the checkpoint does) beside the target's INT8: which scheme its
    quantized layers take; where none takes it, how the draft loads the layer's FP8 tensors."""
    found = run.get("own_scheme")
    if not found:
        return "—"
    if "build" in found:
        return outcome(found)
    schemes = list(found["schemes"].values())
    fp8 = sum("Fp8" in scheme for scheme in schemes)
    if schemes and fp8 == len(schemes):
        return OWN_SCHEME
    if not schemes:
        built = "unquantized: the MTP layer's scheme is not applied"
    elif not fp8:
        built = TARGET_SCHEME
    else:
        built = f"{fp8} of {len(schemes)} layers in its own scheme, the rest in the target's"
    return f"{built}; {FP8_TENSORS_LOAD} {_load_outcome(found['load'])}"


def own_scheme_pairs_outcome(run: dict) -> str:
    """The drafts of the other scheme pairs (MTP layer / target, tests/probes/drafter_matrix.py's
    OWN_SCHEME_PAIRS): OWN_SCHEME_EVERY_PAIR where every quantized layer of each takes the MTP layer's
    scheme, else each pair that does not and what its layers take."""
    pairs = run.get("own_scheme", {}).get("pairs")
    if not pairs:
        return "—"
    missed = []
    for pair, found in pairs.items():
        if "build" in found:
            missed.append(f"{pair}: {outcome(found)}")
            continue
        marker = OWN_SCHEME_MARKERS[pair]
        schemes = list(found["schemes"].values())
        own = sum(marker in scheme for scheme in schemes)
        if schemes and own == len(schemes):
            continue
        if not schemes:
            missed.append(f"{pair}: unquantized, the MTP layer's scheme is not applied")
        elif not own:
            missed.append(f"{pair}: the target's scheme ({', '.join(sorted(set(schemes)))})")
        else:
            missed.append(
                f"{pair}: {own} of {len(schemes)} layers in its own scheme, the rest in the target's"
            )
    return OWN_SCHEME_EVERY_PAIR if not missed else "; ".join(missed)


def load_record(path: Path = RECORD) -> dict[str, dict[str, dict[str, str]]]:
    """release -> drafter key -> Row's fields but the drafter."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DrafterMatrixError(f"{path}: cannot read the drafter matrix record: {error}") from error


def save_record(release: str, rows: dict[str, dict[str, str]], path: Path = RECORD) -> None:
    """Replace one release's rows in the record, the others kept."""
    record = {**load_record(path), release: rows}
    text = json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    crashsafe.write_atomic(path, text.encode("utf-8"))


@dataclass(frozen=True)
class Row:
    drafter: Drafter
    patched: str
    stock: str
    checked_by: str
    # The naming, loading and own-scheme checks (with the series, and stock: "_stock"); "—" where
    # the draft was not built or is static only.
    namings: str = "—"
    own_scheme: str = "—"
    own_scheme_stock: str = "—"
    own_scheme_pairs: str = "—"
    own_scheme_pairs_stock: str = "—"
    missing_tensor: str = "—"
    missing_tensor_stock: str = "—"
    wrong_shape: str = "—"
    wrong_shape_stock: str = "—"


def matrix_rows(release: str, drafters: list[Drafter], record: dict) -> list[Row]:
    """The release's rows. A release with its own record (a test-bed target) must cover every drafter
    its registry lists; one without (0.33.0, a release between the targets) takes the nearest
    record's rows, the newer of two as near, for the drafters it shares and is static only for the
    others."""
    own = record.get(release)
    if own is not None:
        missing = [drafter.key for drafter in drafters if drafter.key not in own]
        if missing:
            raise DrafterMatrixError(
                f"vLLM {release}'s registry lists MTP drafter(s) the matrix does not cover: "
                f"{', '.join(missing)} (record: {RECORD.name}; run the drafter_matrix probe for them)"
            )
        return [Row(d, **own[d.key]) for d in drafters]
    releases = sorted({release, *record}, key=version_key)

    def nearness(version: str) -> tuple[int, int]:
        position = releases.index(version)
        return abs(position - releases.index(release)), -position

    through = min(record, key=nearness, default=None)
    rows = []
    for drafter in drafters:
        found = record[through].get(drafter.key) if through else None
        if found is None:
            rows.append(Row(drafter, "—", "—", STATIC_ONLY))
        else:
            rows.append(Row(drafter, **{**found, "checked_by": f"through {through}: {found['checked_by']}"}))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _source_words(drafter: Drafter) -> str:
    words = _QUANT_SOURCE_WORDS[drafter.quant_source]
    return f"{words} ({', '.join(drafter.own_logic)})" if drafter.own_logic else words


def markdown_table(rows: list[Row], stock: dict[str, Drafter]) -> str:
    """``stock``: the drafters of the release without the series, by key."""
    lines = [
        "| drafter | target model_type / architecture | model file "
        "| quant config from (stock → with the series) "
        "| BF16 MTP layer, INT8 target: with the series | stock vLLM | checked by |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        drafter = row.drafter
        source, stock_source = _source_words(drafter), _source_words(stock[drafter.key])
        cells = (
            f"`{drafter.key}`",
            ", ".join(f"`{target}`" for target in drafter.targets) or "—",
            f"`{drafter.model_file.removeprefix('vllm/')}`",
            source if source == stock_source else f"stock: {stock_source} → {source}",
            row.patched,
            row.stock,
            row.checked_by,
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def loading_table(rows: list[Row]) -> str:
    """The naming, loading and own-scheme checks of the construction probe, with the series / stock."""
    lines = [
        "| drafter | on-disk MTP namings its loader accepts | MTP layer FP8-block in a config group "
        "of its own, INT8 target: with the series / stock | MTP layer in a scheme of its own, "
        f"{', '.join(OWN_SCHEME_MARKERS)}: with the series / stock | other MTP tensors missing: "
        "with the series / stock | MTP tensor of a wrong shape: with the series / stock |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = (
            f"`{row.drafter.key}`",
            row.namings,
            *(
                value if value == stock else f"{value} / {stock}"
                for value, stock in (
                    (row.own_scheme, row.own_scheme_stock),
                    (row.own_scheme_pairs, row.own_scheme_pairs_stock),
                    (row.missing_tensor, row.missing_tensor_stock),
                    (row.wrong_shape, row.wrong_shape_stock),
                )
            ),
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def summary(rows: list[Row], stock: dict[str, Drafter]) -> str:
    """How many drafters bypass the decision (stock, with the series), and how many build unquantized /
    quantized / not at all with the series and stock."""

    def counts(column: str) -> str:
        values = [getattr(row, column).split(":")[0] for row in rows]
        words = {UNQUANTIZED: UNQUANTIZED, QUANTIZED: QUANTIZED, NOT_BUILT: NOT_BUILT, "—": STATIC_ONLY}
        return ", ".join(f"{values.count(value)} {word}" for value, word in words.items() if value in values)

    bypass = sum(row.drafter.quant_source == OWN_LOGIC for row in rows)
    stock_bypass = sum(drafter.quant_source == OWN_LOGIC for drafter in stock.values())
    return (
        f"{len(rows)} MTP drafters; {stock_bypass} decide their quantization themselves on stock vLLM, "
        f"{bypass} with the series. Built with the series: {counts('patched')}. "
        f"Stock: {counts('stock')}."
    )


def release_drafters(pin, with_series: bool = True) -> list[Drafter]:
    """The drafters of a pinned release, with its series applied or stock, read from git objects of
    its pinned tree (nothing checked out, nothing imported)."""
    repo = gittree.open_repo(gittree.pinned_tree(pin))
    if not with_series:
        return read_drafters(revision_reader(repo, pin.tag))
    results, commit = gittree.series_commit(repo, load_series(pin.series_dir), pin.tag)
    if not all(result.ok for result in results):
        failed = ", ".join(f"{result.name} ({result.status})" for result in results if not result.ok)
        raise DrafterMatrixError(
            f"series {pin.series_dir.name} does not apply to vLLM {pin.version}: {failed}"
        )
    return read_drafters(revision_reader(repo, commit))


def render_matrix(pins: dict, record: dict) -> str:
    """The README's support tables: one per pinned release, newest first."""
    sections = []
    for pin in sorted(pins.values(), key=lambda pin: version_key(pin.version), reverse=True):
        rows = matrix_rows(pin.version, release_drafters(pin), record)
        stock = {drafter.key: drafter for drafter in release_drafters(pin, with_series=False)}
        heading = f"### MTP drafters of vLLM {pin.version}"
        sections.append(
            f"{heading}\n\n{summary(rows, stock)}\n\n{markdown_table(rows, stock)}\n\n"
            f"Naming, loading and an MTP scheme of its own, {pin.version}:\n\n{loading_table(rows)}\n"
        )
    return "\n".join(sections)
