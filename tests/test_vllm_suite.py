"""vLLM's own tests of the areas the series touches, from the release's sdist, on the CPU engine
(mtpq/upstream/vllm_suite.py): a patch that breaks one that passes on stock is reported with its error.
Which pass on stock is the release's record (mtpq/upstream/vllm_suite_stock/<release>.json, written by
`upstream suite --record`); that none fails with the series is the release matrix's record
(tests/test_release_matrix.py)."""

from __future__ import annotations

from mtpq.core.series import load_series
from mtpq.upstream import vllm_suite
from tests.series_edits import change_file

# with_retry (vllm/transformers_utils/repo_utils.py) must re-raise a fatal error at once.
FATAL_ERRORS_RAISED = "        except fatal_errors:\n            raise\n"
FATAL_ERRORS_SWALLOWED = "        except fatal_errors:\n            return None\n"
BROKEN_TEST = "tests/transformers_utils/test_repo_utils.py::test_with_retry_does_not_retry_fatal_errors"


def test_a_patch_that_breaks_a_vllm_test_is_reported_with_its_error(engine_series, series_copy):
    installation, pin, series = engine_series
    directory = series_copy(series)
    last = series.patches[-1]
    source = "vllm/transformers_utils/repo_utils.py"
    original = (installation.site / source).read_text()
    assert FATAL_ERRORS_RAISED in original
    change_file(
        directory.parent / last.path.parent.name / last.name,
        source,
        original,
        original.replace(FATAL_ERRORS_RAISED, FATAL_ERRORS_SWALLOWED, 1),
    )
    stock = vllm_suite.load_record(pin, installation)
    one_file = {
        test: s for test, s in stock["passed"].items() if test.startswith(BROKEN_TEST.partition("::")[0])
    }
    assert BROKEN_TEST in one_file

    result = vllm_suite.check(installation, pin, load_series(directory), stock={**stock, "passed": one_file})

    assert [(r.test, r.outcome) for r in result.regressions] == [(BROKEN_TEST, "failed")]
    assert result.regressions[0].error
    assert result.tests == len(one_file)
