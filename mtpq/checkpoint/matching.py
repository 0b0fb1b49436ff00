"""vLLM's compressed-tensors name matching, for running the series' own start-up check of config
groups (the survey module's check_mtp_quant_schemes) without vLLM, and for the doctor's matching.

The check calls these by vLLM's names with checkpoint module names, which are never fused, so no
fused-layer mapping is needed. tests/test_doctor_copies.py compares them with vLLM's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


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
