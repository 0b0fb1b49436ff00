"""pytest plugin (`-p vllm_outcomes`): write each test's outcome, duration and, where it did not
pass, its error line to $MTPQ_OUTCOMES_FILE (JSON lines), by pytest node id. A test file that does
not import is recorded as `<path>::<collection>`."""

import json
import os

_outcomes = {}


def _error(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:500] if text.strip() else ""


def _record(nodeid: str, outcome: str, seconds: float, error: str = "") -> None:
    previous = _outcomes.get(nodeid)
    if previous is None:
        _outcomes[nodeid] = {"outcome": outcome, "seconds": seconds, "error": error}
        return
    previous["seconds"] += seconds
    # A phase that failed (setup, call or teardown) fails the test; a skip in setup skips it.
    if previous["outcome"] == "passed" and outcome != "passed":
        previous.update(outcome=outcome, error=error)


def pytest_runtest_logreport(report):
    if report.passed:
        _record(report.nodeid, "passed", report.duration)
    elif report.skipped:
        _record(report.nodeid, "skipped", report.duration)
    else:
        _record(report.nodeid, "failed", report.duration, _error(report))


def pytest_collectreport(report):
    if report.failed:
        _record(f"{report.nodeid}::<collection>", "failed", 0.0, _error(report))


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["MTPQ_OUTCOMES_FILE"], "w") as out:
        for nodeid, outcome in _outcomes.items():
            out.write(json.dumps({"test": nodeid, **outcome}) + "\n")
