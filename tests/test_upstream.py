"""The newest series as upstream pull requests: readiness, PR directories, the proof of each patch's
vLLM-native tests on the CPU engine (a test that passes without its patch is flagged, one that reaches
a network or runs past the time limit fails at once; the proofs themselves are the release matrix's,
tests/test_release_matrix.py), and upstream's linters.

Runs in the newest target's session only: the series that serves it carries the newest series'
patches (less those for models its release lacks), and the other checks do not depend on the target.
"""

from __future__ import annotations

import sys
import time

import pytest

from mtpq.core.pin import load_pins, newest_pin
from mtpq.core.series import SeriesError, load_series
from mtpq.upstream import lint, native_tests, pull_requests
from tests.commands import run_mtpq
from tests.series_edits import add_new_file


@pytest.fixture(scope="module")
def upstream_series():
    return load_series(newest_pin(load_pins()).series_dir)


def replace_in_patch(directory, name: str, old: str, new: str) -> None:
    path = directory / name
    text = path.read_text()
    assert old in text, f"{name} has no {old!r}"
    path.write_text(text.replace(old, new, 1))


def test_the_newest_series_is_ready_for_upstream(upstream_series):
    assert pull_requests.check_ready(upstream_series) == []
    done = run_mtpq("upstream", "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ready ({len(pull_requests.proposed(upstream_series))} pull request(s))" in done.stdout


def test_every_proposed_patch_carries_a_test_in_vllms_layout(upstream_series):
    for patch in pull_requests.proposed(upstream_series):
        tests = pull_requests.test_files(patch)
        assert tests, patch.name
        assert all(path in pull_requests.sections(patch)["Test Plan"] for path in tests), patch.name


def test_a_patch_without_tests_or_threads_fails_the_check_naming_it(upstream_series, series_copy):
    directory = series_copy(upstream_series)
    first, second, third = (patch.name for patch in pull_requests.proposed(upstream_series)[:3])
    replace_in_patch(directory, first, "\nBug: https://github.com/", "\nBug: see ../shared/seeds/")
    replace_in_patch(directory, second, "\nForwarded: no\n", "\nForwarded: maybe\n")
    replace_in_patch(directory, third, "\nTest Result:\n", "\nResults:\n")
    findings = {(f.patch, f.field) for f in pull_requests.check_ready(load_series(directory))}
    assert {(first, "Bug"), (first, "message"), (second, "Forwarded"), (third, "Test Result")} <= findings


def test_a_bug_naming_a_pull_request_or_left_out_unexplained_fails_the_check(upstream_series, series_copy):
    """Bug: is the bug report a patch fixes; the pull requests it relates to belong in its text. A
    patch no bug report describes leaves Bug: out, as DEP-3 allows, and its Purpose says so."""
    directory = series_copy(upstream_series)
    with_bug = [patch for patch in pull_requests.proposed(upstream_series) if "Bug" in patch.dep3]
    pull_request, unexplained = with_bug[0].name, with_bug[1].name
    replace_in_patch(
        directory,
        pull_request,
        "\nBug: https://github.com/vllm-project/vllm/issues/",
        "\nBug: https://github.com/vllm-project/vllm/pull/",
    )
    text = (directory / unexplained).read_text()
    bug_line = next(line for line in text.splitlines() if line.startswith("Bug: "))
    replace_in_patch(directory, unexplained, f"\n{bug_line}\n", "\n")
    findings = {str(f) for f in pull_requests.check_ready(load_series(directory))}
    names_a_pull_request = f"{pull_request}: Bug: must be the URL of the upstream bug report"
    assert any(finding.startswith(names_a_pull_request) for finding in findings)
    unexplained_finding = "Bug: missing, and the Purpose does not say that no upstream bug report exists"
    assert f"{unexplained}: {unexplained_finding}" in findings
    explained = {patch.name for patch in pull_requests.proposed(upstream_series) if "Bug" not in patch.dep3}
    assert explained
    assert not {f for f in findings if f.partition(":")[0] in explained}


def test_pull_requests_are_numbered_as_they_apply(upstream_series, series_copy):
    """The k-th proposed patch is NNNN-<name>.patch with NNNN = k; a patch not proposed has no number."""
    directory = series_copy(upstream_series)
    first, second, third = (patch.name for patch in pull_requests.proposed(upstream_series)[:3])
    replace_in_patch(directory, first, "\nForwarded: no\n", "\nForwarded: not-needed\n")
    suffixed = third.replace("-", "a-", 1)
    (directory / third).rename(directory / suffixed)
    listing = directory / "series"
    listing.write_text(listing.read_text().replace(third, suffixed))
    findings = {str(f) for f in pull_requests.check_ready(load_series(directory))}
    assert f"{first}: name: is not proposed upstream, so it has no number" in findings
    assert f"{second}: name: pull request 1 of the stack: name it 0001-<name>.patch" in findings
    assert f"{suffixed}: name: pull request 2 of the stack: name it 0002-<name>.patch" in findings


def test_a_patch_that_drops_its_test_file_fails_the_check(upstream_series, series_copy):
    directory = series_copy(upstream_series)
    patch = pull_requests.proposed(upstream_series)[-1]
    (test_file,) = pull_requests.test_files(patch)
    text = (directory / patch.name).read_text()
    start = text.index(f"diff --git a/{test_file}")
    following = text.find("\ndiff --git ", start + 1)
    (directory / patch.name).write_text(text[:start] + (text[following + 1 :] if following != -1 else ""))
    findings = [str(f) for f in pull_requests.check_ready(load_series(directory))]
    assert f"{patch.name}: tests: adds no test file under tests/ (tests/**/test_*.py)" in findings


def test_a_patch_without_a_forwarded_field_is_refused_naming_it(upstream_series, series_copy):
    directory = series_copy(upstream_series)
    name = upstream_series.patches[0].name
    replace_in_patch(directory, name, "\nForwarded: no\n", "\n")
    with pytest.raises(SeriesError, match=f"{name}: DEP-3 field.*Forwarded"):
        load_series(directory)


def test_pull_request_directories_hold_the_patch_title_and_body(upstream_series, tmp_path):
    out = tmp_path / "prs"
    done = run_mtpq("upstream", "prs", str(out))
    assert done.returncode == 0, done.stderr
    stack = pull_requests.proposed(upstream_series)
    directories = sorted(out.iterdir())
    assert [d.name for d in directories] == [p.path.stem for p in stack]
    for directory, patch in zip(directories, stack, strict=True):
        assert (directory / patch.name).read_bytes() == patch.path.read_bytes()
        assert (directory / "title.txt").read_text() == patch.subject + "\n"
        body = (directory / "body.md").read_text()
        assert body.startswith("## Purpose\n") and "## Test Plan\n" in body and "## Test Result\n" in body
        assert "Origin:" not in body
    assert "## Depends on" not in (directories[0] / "body.md").read_text()
    assert stack[0].subject in (directories[-1] / "body.md").read_text()
    again = run_mtpq("upstream", "prs", str(out))
    assert again.returncode == 2 and "exists" in again.stderr


def _with_a_file_added(series, series_copy, patch, path, *lines):
    """A copy of `series` whose `patch` also adds the file `path`, of `lines`."""
    directory = series_copy(series)
    add_new_file(directory.parent / patch.path.parent.name / patch.name, path, *lines)
    return load_series(directory)


def test_the_tests_tree_holds_what_a_patch_changes_of_the_suite(pin, series, series_copy):
    """Not only test files: a patch may mend the suite itself (a conftest fixture)."""
    without_tests = next(patch for patch in series.patches if not pull_requests.test_files(patch))
    helper = "tests/mtpq_suite_helper.py"
    copied = _with_a_file_added(series, series_copy, without_tests, helper, "HELPER = 1")

    tree = native_tests.tests_tree(pin, copied)

    assert (tree / helper).read_text() == "HELPER = 1\n"


def test_a_test_that_passes_without_its_patch_is_flagged(engine_series, series_copy):
    installation, pin, series = engine_series
    copied = _with_a_file_added(
        series,
        series_copy,
        series.patches[-1],
        "tests/test_mtpq_cannot_fail.py",
        "def test_nothing():",
        "    assert True",
    )
    (proof,) = native_tests.prove(installation, pin, copied, only={series.patches[-1].name})
    expected = "tests/test_mtpq_cannot_fail.py::test_nothing passes without the patch: it cannot fail"
    assert expected in proof.problems
    assert not proof.ok


def test_a_vllm_test_reaching_a_network_or_running_past_the_limit_fails_at_once_and_the_hub_stays_offline(
    engine_series, series_copy, monkeypatch
):
    installation, pin, series = engine_series
    bounds = "tests/test_mtpq_bounds.py"
    copied = _with_a_file_added(
        series,
        series_copy,
        series.patches[-1],
        bounds,
        "import time",
        "import urllib.request",
        "def test_the_hub():",
        '    urllib.request.urlopen("https://huggingface.co/api/models", timeout=300)',
        "def test_forever():",
        "    time.sleep(600)",
        "def test_turning_the_hub_on():",
        "    import huggingface_hub.constants",
        "    huggingface_hub.constants.HF_HUB_OFFLINE = False",
        "def test_the_hub_is_off_again():",
        "    import huggingface_hub.constants",
        "    assert huggingface_hub.constants.HF_HUB_OFFLINE",
    )
    monkeypatch.setenv("MTPQ_TEST_TIME_LIMIT", "10")
    tree = native_tests.tests_tree(pin, copied)
    stock = native_tests.overlays(installation, series)[0]
    started = time.monotonic()

    run = native_tests.run_pytest(installation.python, tree, stock, [bounds])

    assert time.monotonic() - started < 300  # test_forever alone would take 600 s
    assert run.errors == {
        f"{bounds}::test_the_hub": "urllib.error.URLError: <urlopen error no network in these tests (a "
        "connection to huggingface.co)>",
        f"{bounds}::test_forever": "vllm_bounds.TimeLimitExceeded: the test ran past the time limit of 10 s",
    }
    assert run.outcomes[f"{bounds}::test_the_hub_is_off_again"] == "passed"


# Wiring new tests into Buildkite is left to the PR branch: the CPU job's command list differs
# between 0.32.0 and 0.33.0, and the v0.32.0 series applies these very patches. The hook still runs
# and reports (README: The series as upstream pull requests).
REPORTED_ONLY = {"check-test-tethering"}


@pytest.mark.engine  # lints the release's sources with its hooks (they need regex)
def test_upstreams_linters_pass_on_the_series(upstream_series):
    pin = newest_pin(load_pins())
    results = lint.lint(pin, upstream_series, sys.executable)
    failed = {r.hook: r.output for r in results if not r.ok and r.hook not in REPORTED_ONLY}
    assert failed == {}
    assert {"ruff-check", "ruff-format", "typos", "check-spdx-header", *REPORTED_ONLY} <= {
        r.hook for r in results
    }


def test_review_finds_nothing_a_maintainer_refuses_in_the_series(upstream_series):
    review = lint.review(upstream_series)
    assert (review.hook, review.ok, review.output) == ("mtpq-review", True, "")


def test_review_names_each_refused_line_by_patch_file_and_rule(upstream_series, series_copy):
    directory = series_copy(upstream_series)
    last = upstream_series.patches[-1]
    probe = "vllm/mtpq_review_probe.py"
    add_new_file(
        directory / last.name,
        probe,
        "import sys",
        "from vllm.config.quantization import _ONLINE_SHORTHANDS",
        "from vllm.config.utils import (",
        "    hash_factors,",
        "    _private_helper as helper,",
        ")",
        "try:",
        "    local = sys._getframe().f_locals",
        "except Exception:",
        "    pass",
        "except (BaseException, KeyError):",
        "    pass",
        "except:",
        "    pass",
        "except ValueError:",
        "    pass",
    )
    add_new_file(directory / last.name, "tests/test_mtpq_review_probe.py", "except Exception:")
    review = lint.review(load_series(directory))
    assert not review.ok
    where = f"{last.name}: {probe}: "
    assert "test_mtpq_review_probe" not in review.output
    assert [line for line in review.output.splitlines() if probe in line] == [
        f"{where}imports a private vLLM name: from vllm.config.quantization import _ONLINE_SHORTHANDS",
        f"{where}imports a private vLLM name: _private_helper as helper,",
        f"{where}reads a frame's local variables: local = sys._getframe().f_locals",
        f"{where}catches every exception: except Exception:",
        f"{where}catches every exception: except (BaseException, KeyError):",
        f"{where}catches every exception: except:",
    ]


@pytest.mark.engine  # lints the release's sources with its hooks (they need regex)
def test_upstreams_linters_name_a_file_without_an_spdx_header(upstream_series, series_copy):
    directory = series_copy(upstream_series)
    last = upstream_series.patches[-1]
    added = "vllm/mtpq_lint_probe.py"
    add_new_file(directory / last.name, added, "VALUE = 1")
    results = lint.lint(newest_pin(load_pins()), load_series(directory), sys.executable)
    failed = {r.hook: r.output for r in results if not r.ok and r.hook not in REPORTED_ONLY}
    assert list(failed) == ["check-spdx-header"] and added in failed["check-spdx-header"]
