"""Property-based tests of the header survey: generated headers, mutations of them, arbitrary JSON and
bytes, tensor names and checkpoint directories (tests/survey_cases.py). Over 10,000 inputs per session,
the same ones every run; benchmarks/survey_fuzz.py runs many more with fresh seeds."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import survey_cases as cases

# benchmarks/survey_fuzz.py: that many times the inputs, from a random seed.
SCALE = int(os.environ.get("MTPQ_SURVEY_SCALE", "1"))


def examples(count: int):
    return settings(
        max_examples=count * SCALE,
        deadline=None,
        derandomize=SCALE == 1,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("survey-inputs")


def test_generated_headers_read_as_json_means_them(scratch):
    @examples(2500)
    @given(cases.headers)
    def check(header):
        cases.check_header(scratch / "model.safetensors", *header)

    check()


def test_mutated_headers_are_read_as_json_means_them_or_refused(scratch):
    @examples(2500)
    @given(cases.mutated_headers)
    def check(header):
        cases.check_header(scratch / "model.safetensors", *header)

    check()


def test_any_json_value_as_a_header_is_read_or_refused(scratch):
    @examples(2000)
    @given(cases.any_json_headers)
    def check(header):
        cases.check_header(scratch / "model.safetensors", *header)

    check()


def test_any_bytes_as_a_file_give_a_header_or_the_module_error(scratch):
    @examples(1500)
    @given(
        st.binary(max_size=512) | st.binary(max_size=64).map(lambda tail: (8).to_bytes(8, "little") + tail)
    )
    def check(data):
        cases.check_any_file(scratch / "model.safetensors", data)

    check()


@examples(1500)
@given(cases.names)
def test_mtp_tensor_names_are_recognised_as_their_components_say(name):
    cases.check_name(name)


def test_checkpoint_directories_give_a_survey_or_the_module_errors(scratch):
    directory = scratch / "checkpoint"
    directory.mkdir()

    @examples(400)
    @given(cases.checkpoints())
    def check(checkpoint):
        cases.check_checkpoint(directory, checkpoint)

    check()
