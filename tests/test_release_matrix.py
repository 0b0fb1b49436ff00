"""The release matrix (mtpq/upstream/release_matrix.json, written by `python3 -m mtpq upstream releases
--python BED --write` on each release's own CPU engine): every release with a CPU build is recorded as
proven, from the series files and pins it has now, and the README's table is the one rendered from it.
"""

from __future__ import annotations

import dataclasses

from mtpq.core.pin import load_pins
from mtpq.core.series import load_series
from mtpq.upstream import pull_requests, release_matrix
from tests.commands import run_mtpq
from tests.conftest import ROOT
from tests.e2e_cases import CASES

REWRITE = "python3 -m mtpq upstream releases --python <test bed>/bin/python --write"
README_START = "<!-- release-matrix:start (python3 -m mtpq upstream releases) -->\n"
README_END = "<!-- release-matrix:end -->"


def test_every_release_with_a_cpu_build_is_recorded_from_the_series_and_pins_it_has_now():
    assert release_matrix.stale(load_pins(), release_matrix.load_record()) == [], (
        f"prove them again: {REWRITE}"
    )


def proposed(pin) -> set[str]:
    return {patch.name for patch in pull_requests.proposed(load_series(pin.series_dir))}


def test_every_recorded_release_is_proven_for_each_pull_request_and_without_regressions():
    pins, record = load_pins(), release_matrix.load_record()
    for version, entry in record.items():
        proofs = entry["native_proofs"]
        assert proofs and all(proof["tests"] > 0 for proof in proofs.values()), version
        proven = proposed(pins[version]) & set(proofs)
        assert all(proofs[name]["fail_without"] == proofs[name]["tests"] for name in proven), version
        assert entry["vllm_suite"] is None or entry["vllm_suite"]["fail_with_series"] == 0, version
    # The newest release has no CPU build: every one of its pull requests is proven through one that has.
    newest = list(pins.values())[-1]
    through = release_matrix.proven_through(newest, pins)
    assert through is not None and proposed(newest) <= set(record[through.version]["native_proofs"])


def test_every_release_with_a_cpu_build_is_proven_end_to_end_on_a_dense_and_an_moe_checkpoint():
    by_name = {case.name(): case for case in CASES}
    cases = [by_name[name] for name in release_matrix.END_TO_END_CASES]
    assert {case.arch for case in cases} == {"mimo", "glm4_moe"}  # a dense model and an MoE one
    assert {case.options.get("ignore_style", "names") for case in cases} == {"names", "unlisted"}
    pins, record = load_pins(), release_matrix.load_record()
    for version, pin in pins.items():
        if release_matrix.CPU_WHEEL in pin.artifacts:
            end_to_end = record[version]["end_to_end"]
            assert end_to_end["tests"] == 2 * len(cases), version
            assert set(end_to_end["stock"]) == set(release_matrix.END_TO_END_CASES), version


def test_a_changed_patch_or_pin_makes_its_release_stale(series_copy):
    pins, record = load_pins(), release_matrix.load_record()
    version = next(iter(record))
    pin = pins[version]
    copied = series_copy(load_series(pin.series_dir))
    last = load_series(copied).patches[-1].path
    last.write_text(last.read_text().replace("\n---\n", "\n\nOne more line of message.\n---\n", 1))
    edited = dataclasses.replace(pin, series_name=str(copied))  # an absolute series_name: the copy
    cpu_wheel = pin.artifacts[release_matrix.CPU_WHEEL]
    moved = dataclasses.replace(
        pin,
        artifacts={
            **pin.artifacts,
            release_matrix.CPU_WHEEL: dataclasses.replace(cpu_wheel, sha256="0" * 64),
        },
    )
    was = f"({record[version]['series_id']})"

    assert release_matrix.stale({**pins, version: edited}, record) == [
        f"{version}: recorded for another series_id {was}"
    ]
    assert release_matrix.stale({**pins, version: moved}, record) == [
        f"{version}: recorded for another pin {was}"
    ]
    assert release_matrix.stale(pins, {**record, "0.0.1": record[version]}) == [
        "0.0.1: recorded but not pinned"
    ]
    without = {other: entry for other, entry in record.items() if other != version}
    assert release_matrix.stale(pins, without) == [f"{version}: not recorded"]


def test_the_readme_table_is_the_rendered_record():
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(README_START) + len(README_START), readme.index(README_END)
    assert readme[start:end] == release_matrix.render(load_pins(), release_matrix.load_record()), (
        "regenerate it: python3 -m mtpq upstream releases"
    )


def test_the_command_prints_the_table_and_exits_0_when_nothing_is_stale():
    done = run_mtpq("upstream", "releases")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == release_matrix.render(load_pins(), release_matrix.load_record())
