"""apply.py --wheel: a patched wheel made from the official PyPI wheel, reproducibly."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mtpq.apply.wheel import patched_files
from mtpq.core.download import fetch

ARCH = "x86_64"


def build(run_apply, release, out: Path) -> Path:
    done = run_apply("--wheel", "--arch", ARCH, "--vllm", release.version, "--out", str(out))
    assert done.returncode == 0, done.stderr
    wheel = Path(done.stdout.strip().splitlines()[-1])
    assert wheel.parent == out and wheel.is_file()
    return wheel


def wheel_name(pin, series, arch: str) -> str:
    """The patched wheel's name: the official one's platform and build tag, the series in its version."""
    build = f"-{pin.wheel_build}" if pin.wheel_build else ""
    return f"vllm-{pin.version}+mtpq.{series.series_id}{build}-cp38-abi3-{pin.wheel_platform}_{arch}.whl"


@pytest.fixture(scope="session")
def wheel(run_apply, newest_pin, tmp_path_factory) -> Path:
    """The x86_64 wheel of the newest release the series serves."""
    return build(run_apply, newest_pin, tmp_path_factory.mktemp("dist"))


def test_name_and_metadata_carry_the_series(wheel, newest_pin, newest_series):
    assert wheel.name == wheel_name(newest_pin, newest_series, ARCH)
    info = f"vllm-{newest_pin.version}+mtpq.{newest_series.series_id}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"{info}/METADATA").decode()
        carried = json.loads(archive.read(f"{info}/mtpq.json"))
    assert f"\nVersion: {newest_pin.version}+mtpq.{newest_series.series_id}\n" in metadata
    assert [p["name"] for p in carried["patches"]] == [p.name for p in newest_series.patches]
    assert all(p.name in metadata for p in newest_series.patches)


def test_release_info_names_the_aarch64_wheel_as_apply_writes_it(run_apply, newest_pin, newest_series):
    """docker/build.sh finds the sm121 image's wheel in dist/ by this name."""
    done = run_apply("--release-info", "--vllm", newest_pin.version)
    assert done.returncode == 0, done.stderr
    assert f"aarch64_wheel={wheel_name(newest_pin, newest_series, 'aarch64')}" in done.stdout.splitlines()


def test_record_lists_every_file_with_its_hash(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (record_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        assert {row[0] for row in rows} == set(archive.namelist())
        for name, digest, size in rows:
            if name == record_name:
                continue
            data = archive.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={expected}", str(len(data))), name


def test_official_files_are_inside_unchanged_and_patched_files_replaced(wheel, newest_pin, newest_series):
    replaced = patched_files(newest_pin, newest_series)
    with zipfile.ZipFile(fetch(newest_pin.wheel(ARCH))) as official, zipfile.ZipFile(wheel) as ours:
        ours_by_name = {info.filename: info for info in ours.infolist()}
        for info in official.infolist():
            if ".dist-info/" in info.filename:
                continue
            if info.filename in replaced:
                assert ours.read(info.filename) == replaced[info.filename]
            else:
                assert (ours_by_name[info.filename].CRC, ours_by_name[info.filename].file_size) == (
                    info.CRC,
                    info.file_size,
                ), info.filename


def test_two_builds_are_byte_identical(wheel, run_apply, newest_pin, tmp_path):
    assert build(run_apply, newest_pin, tmp_path).read_bytes() == wheel.read_bytes()


def test_wheel_installs_with_pip_and_carries_the_patched_files(wheel, newest_pin, newest_series, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-qq",
            "--no-deps",
            "--no-compile",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    for relative, data in patched_files(newest_pin, newest_series).items():
        assert (target / relative).read_bytes() == data, relative


def test_unknown_arch_is_refused_and_nothing_written(run_apply, tmp_path):
    done = run_apply("--wheel", "--arch", "riscv64", "--out", str(tmp_path / "dist"))
    assert done.returncode == 2 and "unknown arch 'riscv64'" in done.stderr
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("0.25.1", "vLLM 0.25.1 has no mtpq series yet"),
        (
            "0.34.0rc1",
            "vLLM 0.34.0rc1 is a pre-release or development build: mtpq carries releases 0.19.0 to",
        ),
        ("1.0.0", "vLLM 1.0.0 is outside the releases mtpq carries (0.19.0 to"),
    ],
)
def test_unsupported_release_is_refused_listing_the_supported_ones(
    run_apply, newest_pin, tmp_path, version, why
):
    done = run_apply("--wheel", "--arch", ARCH, "--vllm", version, "--out", str(tmp_path / "dist"))
    assert done.returncode == 2 and why in done.stderr
    assert newest_pin.version in done.stderr and "--rebase" in done.stderr
    assert not (tmp_path / "dist").exists()


def test_base_wheel_checksum_mismatch_fails_closed(run_apply, index, newest_pin, tmp_path):
    official = newest_pin.wheel(ARCH)
    index.serve(official.project, official.filename, b"not the official wheel")
    out = tmp_path / "dist"
    done = run_apply(
        "--wheel",
        "--arch",
        ARCH,
        "--vllm",
        newest_pin.version,
        "--out",
        str(out),
        env={"MTPQ_INDEX_URL": index.url, "MTPQ_CACHE_DIR": str(index.cache)},
    )
    assert done.returncode == 2 and "sha256 mismatch" in done.stderr
    assert not out.exists() or not any(out.iterdir())
