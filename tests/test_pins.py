"""VLLM_VERSIONS: every supported release pinned in one file, read strictly."""

from __future__ import annotations

import pytest

from mtpq.core.pin import PIN_FILE, PinError, load_pins, newest_pin, pin_for

SHA = "0" * 64
GOOD_SECTION = f"[9.9.9]\nseries = v9.9.9\ncommit = gabc\nsdist_sha256 = {SHA}\n"


@pytest.fixture
def pin_file(tmp_path):
    def write(text: str):
        path = tmp_path / "VLLM_VERSIONS"
        path.write_text(text)
        return path

    return write


def test_every_release_names_an_existing_series_and_pins_sdist_and_cuda_wheels():
    pins = load_pins()
    assert list(pins) == sorted(pins, key=lambda version: tuple(map(int, version.split("."))))
    for pin in pins.values():
        assert (pin.series_dir / "series").is_file(), pin
        assert {"sdist", "wheel-x86_64", "wheel-aarch64"} <= set(pin.artifacts), pin


def test_the_newest_release_is_the_default():
    assert newest_pin().version == list(load_pins())[-1]


def test_an_unsupported_release_is_refused_listing_the_supported_ones_and_the_way_to_add_it():
    with pytest.raises(PinError) as raised:
        pin_for("0.25.1")
    message = str(raised.value)
    assert "vLLM 0.25.1 has no mtpq series" in message
    assert all(f"{version} (series " in message for version in load_pins())
    assert "--rebase" in message and "--export" in message and PIN_FILE.name in message


def test_an_artifact_a_release_does_not_pin_is_a_clear_error(pin_file):
    pin = load_pins(pin_file(GOOD_SECTION))["9.9.9"]
    with pytest.raises(PinError, match="pins no cpu-wheel-x86_64 for vLLM 9.9.9 .no cpu_wheel_x86_64_sha256"):
        pin.artifact("cpu-wheel-x86_64")
    with pytest.raises(PinError, match="pins no wheel-aarch64 for vLLM 9.9.9"):
        pin.wheel("aarch64")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD_SECTION.replace(f"sdist_sha256 = {SHA}\n", ""), r"\[9.9.9\] lacks sdist_sha256"),
        (GOOD_SECTION.replace("series = v9.9.9\n", ""), r"\[9.9.9\] lacks series"),
        (GOOD_SECTION + "wheel_x86_64_sha256 = 1234\n", "wheel_x86_64_sha256 is not a lower-case sha256"),
        (GOOD_SECTION + "wheel_riscv_sha256 = x\n", "unknown key.*wheel_riscv_sha256"),
        (GOOD_SECTION.replace("[9.9.9]", "[latest]"), r"\[latest\] is not a release number"),
        ("# nothing pinned\n", "no release is pinned"),
        ("sdist_sha256 = x\n", "unreadable"),
    ],
    ids=["no-sdist", "no-series", "bad-sha", "unknown-key", "bad-section", "empty", "no-section"],
)
def test_a_malformed_pin_file_names_what_is_wrong(pin_file, text, message):
    with pytest.raises(PinError, match=message):
        load_pins(pin_file(text))


def test_the_sm121_image_inputs_are_release_numbers(pin_file):
    pin = load_pins(pin_file(GOOD_SECTION + "sm121_torch = 2.14.0\n"))["9.9.9"]
    assert pin.sm121 == {"sm121_torch": "2.14.0"}
    with pytest.raises(PinError, match=r"\[9.9.9\] sm121_cuda must be a release number"):
        load_pins(pin_file(GOOD_SECTION + "sm121_cuda = 13\n"))
