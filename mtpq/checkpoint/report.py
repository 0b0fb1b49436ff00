"""The doctor's report: text for people, JSON for pipelines, and the exit code."""

from __future__ import annotations

from mtpq.checkpoint.doctor import CRASH, OFF, UNKNOWN, ZERO, Diagnosis, scheme_label

EXIT_WORKS = 0
EXIT_BROKEN = 1  # a crash, silent 0 % acceptance or MTP silently off
EXIT_UNKNOWN = 3  # nothing broken that the doctor knows of, but something it cannot tell
NAMED_WITH_VLLM = "--vllm"
_RELEASE = "\0"  # a release's number in what the report says of it, while grouping releases
INSTALLED_HERE = "installed here"


def exit_code(diagnosis: Diagnosis, flavour: str) -> int:
    """The verdict on the release named with --vllm, else the worst verdict on any release."""
    judged = [diagnosis.named] if diagnosis.named_by == NAMED_WITH_VLLM else list(diagnosis.verdicts)
    kinds = {diagnosis.verdicts[version][flavour].kind for version in judged}
    if kinds & {CRASH, ZERO, OFF}:
        return EXIT_BROKEN
    return EXIT_UNKNOWN if UNKNOWN in kinds else EXIT_WORKS


def as_json(diagnosis: Diagnosis, flavour: str) -> dict:
    checkpoint, declaration = diagnosis.checkpoint, diagnosis.declaration
    coverage = checkpoint.coverage
    ignore_field, ignore = checkpoint.ignore_entries()
    return {
        "checkpoint": checkpoint.name,
        "architecture": checkpoint.architecture,
        "mtp_architecture": diagnosis.architecture and diagnosis.architecture.name,
        "num_hidden_layers": checkpoint.num_hidden_layers,
        "declared": {"count": declaration.count, "known": declaration.known, "source": declaration.source},
        "mtp_tensors": {
            "layouts": diagnosis.layouts(),
            "expected_layout": diagnosis.architecture and diagnosis.architecture.layout,
            "files": diagnosis.mtp_files(),
            "modules": diagnosis.modules(),
            "layers": diagnosis.stored_layers(),
            "missing": diagnosis.missing_mtp,
        },
        "index": {
            "present": checkpoint.index is not None,
            # None: the headers of files without MTP tensors were not read (a remote checkpoint)
            "complete": None if checkpoint.unread_files else coverage.complete,
            "unread_files": list(checkpoint.unread_files),
            "missing_files": sorted(coverage.missing_files),
            "unmapped": coverage.unmapped,
            "misplaced": coverage.misplaced,
            "duplicates": coverage.duplicates,
            "unindexed_files": coverage.unindexed_files,
            "total_size": coverage.total_size,
        },
        "quantization": checkpoint.quantization
        and {
            "source": checkpoint.quantization_source,
            "scheme": scheme_label(checkpoint.quantization),
            "ignore_field": ignore_field,
            "ignore": ignore,
        },
        "platform": diagnosis.platform,
        "named": diagnosis.named and {"release": diagnosis.named, "by": diagnosis.named_by},
        "releases": {
            version: {
                "series": diagnosis.series[version],
                **{flavour: vars(verdict) for flavour, verdict in verdicts.items()},
                "fix": diagnosis.fixes[version],
            }
            for version, verdicts in diagnosis.verdicts.items()
        },
        "read": {
            "bytes_read": checkpoint.bytes_read,
            "checkpoint_bytes": checkpoint.checkpoint_bytes,
            "header_files": len(checkpoint.header_files),
            "seconds": round(diagnosis.seconds, 3),
        },
        "judged": flavour,
        "exit_code": exit_code(diagnosis, flavour),
    }


def as_text(diagnosis: Diagnosis) -> str:
    checkpoint, declaration, architecture = (
        diagnosis.checkpoint,
        diagnosis.declaration,
        diagnosis.architecture,
    )
    known_as = f"{architecture.name}, " if architecture else "no MTP architecture known here, "
    lines = [
        f"checkpoint    {checkpoint.name} ({checkpoint.architecture}: {known_as}"
        f"{checkpoint.num_hidden_layers} decoder layers)",
        f"MTP declared  {_count(declaration) if declaration.known else 'unknown'} ({declaration.source})",
        f"MTP tensors   {_tensors(diagnosis)}",
        f"index         {_index(diagnosis)}",
        f"quantization  {_quantization(checkpoint)}",
    ]
    for fmt, names in _by_format(diagnosis.modules()).items():
        lines.append(f"  {fmt}: {len(names)} MTP module(s): {_first(names)}")
    for versions, said in _release_groups(diagnosis):
        series = ", ".join(dict.fromkeys(diagnosis.series[version] for version in versions))
        named = f"; {diagnosis.named_by}" if versions == [diagnosis.named] else ""
        lines.append(f"vLLM {', '.join(versions)} ({diagnosis.platform}; mtpq series {series}{named})")
        lines.extend(line.replace(_RELEASE, ", ".join(versions)) for line in said)
    lines.append(
        f"read          config files and safetensors headers only: {_size(checkpoint.bytes_read)} of "
        f"{_size(checkpoint.checkpoint_bytes)} ({len(checkpoint.header_files)} file(s)) "
        f"in {diagnosis.seconds:.2f} s"
    )
    return "\n".join(lines)


def _release_groups(diagnosis: Diagnosis) -> list[tuple[list[str], list[str]]]:
    """(releases, what the report says of them, their number written _RELEASE): the named release alone
    first, then the others in the order diagnosed, those of which it says the same together."""
    groups: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
    for version, verdicts in diagnosis.verdicts.items():
        said = [
            f"  {label:<11} {verdict.kind}: {verdict.why}"
            + (f" [error: {verdict.error}]" if verdict.error else "")
            for label, verdict in (("stock", verdicts["stock"]), ("+ mtpq", verdicts["patched"]))
        ]
        said = [line.replace(version, _RELEASE) for line in said]
        said += [f"  {'fix':<11} {fix}".replace(version, _RELEASE) for fix in diagnosis.fixes[version]]
        key = (_RELEASE,) if version == diagnosis.named else tuple(said)
        groups.setdefault(key, ([], said))[0].append(version)
    return list(groups.values())


def _count(declaration) -> str:
    return f"yes, {declaration.count} layer(s)" if declaration.count else "no"


def _tensors(diagnosis: Diagnosis) -> str:
    checkpoint = diagnosis.checkpoint
    if diagnosis.survey is None and not diagnosis.missing_mtp:
        return "none"
    found = []
    if modules := diagnosis.modules():
        # Every file holding a tensor of theirs: packed formats have no `weight`.
        files = sorted(
            {file for name, file in checkpoint.tensor_files.items() if name.rpartition(".")[0] in modules}
        )
        found.append(f"{len(modules)} modules under {', '.join(diagnosis.layouts())} in {', '.join(files)}")
        expected = diagnosis.architecture and diagnosis.architecture.layout
        if expected and ", ".join(diagnosis.layouts()) != expected:
            found.append(f"but vLLM's {diagnosis.architecture.name} draft loads {expected}")
        if diagnosis.layers_missing:
            stored = diagnosis.stored_layers()
            found.append(
                f"{len(stored)} of the {diagnosis.declaration.count} layers declared: {', '.join(stored)}"
            )
    for file, names in diagnosis.missing_mtp.items():
        found.append(f"{len(names)} mapped to {file}, which is missing")
    return "; ".join(found)


def _index(diagnosis: Diagnosis) -> str:
    checkpoint, coverage = diagnosis.checkpoint, diagnosis.checkpoint.coverage
    indexed = checkpoint.index is not None
    state = f"{'model.safetensors.index.json' if indexed else 'none'}, {len(checkpoint.header_files)} file(s)"
    problems = [f"{file} missing ({len(names)} tensors)" for file, names in coverage.missing_files.items()]
    problems += [f"{name} in {' and '.join(files)}" for name, files in list(coverage.duplicates.items())[:3]]
    if coverage.unmapped:
        problems.append(f"{len(coverage.unmapped)} tensors not in the index (e.g. {coverage.unmapped[0]})")
    if coverage.misplaced:
        problems.append(
            f"{len(coverage.misplaced)} mapped to a file without them (e.g. {coverage.misplaced[0]})"
        )
    if coverage.total_size:
        problems.append(f"total_size {coverage.total_size[0]}, the files hold {coverage.total_size[1]} bytes")
    if coverage.unindexed_files:
        problems.append(f"not in the index, so vLLM skips them: {', '.join(coverage.unindexed_files)}")
    if checkpoint.unread_files:
        # a remote checkpoint: the shards without MTP tensors are known by the index and their sizes
        state += f" read, {len(checkpoint.unread_files)} without MTP tensors not read"
    if problems:
        return f"{state}: {'; '.join(problems)}"
    complete = "every tensor mapped, every mapped file present, " if indexed else ""
    of_those = " of those read" if checkpoint.unread_files else ""
    return f"{state}: {complete}no tensor in two files{of_those}"


def _quantization(checkpoint) -> str:
    if checkpoint.quantization is None:
        return "none"
    field, entries = checkpoint.ignore_entries()
    listed = f"{field} ({len(entries)}): {_first(entries, 6)}" if field else "no ignore list"
    return f"{scheme_label(checkpoint.quantization)} ({checkpoint.quantization_source}); {listed}"


def _by_format(modules: dict[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, fmt in modules.items():
        grouped.setdefault(fmt, []).append(name)
    return grouped


def _first(names: list[str], limit: int = 4) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(map(str, names[:limit])) + more


def _size(num_bytes: int) -> str:
    size, unit = float(num_bytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{num_bytes} B" if unit == "B" else f"{size:.1f} {unit}"
