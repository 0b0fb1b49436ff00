"""Pinned downloads: sha256-verified against VLLM_VERSIONS, cached, failing closed."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys

import pytest

from mtpq.core.download import DEFAULT_INDEX_URL, DownloadError, fetch, index_url, pip_environment
from mtpq.core.pin import Artifact, load_pins
from tests.conftest import ROOT

GOOD = b"the pinned artifact\n"


ARTIFACT = Artifact("demo", "demo-1.0.tar.gz", hashlib.sha256(GOOD).hexdigest())


def test_verified_download_is_cached_and_reused_offline(index, monkeypatch):
    index.serve("demo", ARTIFACT.filename, GOOD)
    path = fetch(ARTIFACT)
    assert path.read_bytes() == GOOD and path.parent == index.cache / "downloads"
    monkeypatch.setenv("MTPQ_INDEX_URL", "http://127.0.0.1:9")  # nothing listens there
    assert fetch(ARTIFACT) == path


def test_a_download_is_announced_with_progress_on_a_terminal_alone(index, capsys, monkeypatch):
    index.serve("demo", ARTIFACT.filename, GOOD)
    fetch(ARTIFACT)
    piped = capsys.readouterr().err
    (index.cache / "downloads" / ARTIFACT.filename).unlink()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    fetch(ARTIFACT)

    said = f"downloading {ARTIFACT.filename} (0.0 MiB) from {index.url}"
    ours = [line for line in piped.splitlines() if "downloading" in line]  # the index server logs too
    assert len(ours) == 1 and ours[0].startswith(said) and "\r" not in piped
    assert f"{said}" in terminal.getvalue()
    assert f"\rdownloading {ARTIFACT.filename}: 0.0 MiB of 0.0 MiB (100 %)\n" in terminal.getvalue()


def test_tampered_download_is_refused_and_nothing_is_kept(index):
    index.serve("demo", ARTIFACT.filename, b"something else\n")
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        fetch(ARTIFACT)
    assert not [path for path in index.cache.rglob("*") if path.is_file()]


def test_damaged_cache_entry_is_replaced_by_a_verified_copy(index):
    index.serve("demo", ARTIFACT.filename, GOOD)
    cached = index.cache / "downloads" / ARTIFACT.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"truncated")
    assert fetch(ARTIFACT).read_bytes() == GOOD


def test_no_network_and_empty_cache_is_a_clear_error(index, monkeypatch):
    monkeypatch.setenv("MTPQ_INDEX_URL", "http://127.0.0.1:9")
    with pytest.raises(DownloadError, match="cannot download demo-1.0.tar.gz"):
        fetch(ARTIFACT)


def test_apply_refuses_a_tampered_sdist_and_builds_no_tree(index, run_apply, pin):
    sdist = pin.artifacts["sdist"]
    index.serve(sdist.project, sdist.filename, b"not the vLLM sdist\n")
    done = run_apply(
        "--vllm", pin.version, env={"MTPQ_INDEX_URL": index.url, "MTPQ_CACHE_DIR": str(index.cache)}
    )
    assert done.returncode == 2
    assert "sha256 mismatch" in done.stderr and sdist.sha256 in done.stderr
    assert f"downloading {sdist.filename} (0.0 MiB) from {index.url}" in done.stderr  # said, plain
    assert "\r" not in done.stderr
    assert not (index.cache / "src").exists()
    assert not (index.cache / "downloads" / sdist.filename).exists()


def test_mtpq_matrix_says_what_it_downloads_and_refuses_a_tampered_sdist_in_one_line(index):
    for pin in load_pins().values():
        index.serve(pin.artifacts["sdist"].project, pin.artifacts["sdist"].filename, b"not the vLLM sdist\n")
    done = subprocess.run(
        [sys.executable, "-m", "mtpq", "matrix"], cwd=ROOT, capture_output=True, text=True, env=os.environ
    )
    said, error = done.stderr.splitlines()
    assert done.returncode == 2 and done.stdout == ""
    assert said.startswith("downloading vllm-") and f"from {index.url}" in said
    assert error.startswith("error: sha256 mismatch")


def test_apply_offline_with_an_empty_cache_says_so(run_apply, tmp_path):
    done = run_apply(env={"MTPQ_INDEX_URL": "http://127.0.0.1:9", "MTPQ_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 2 and "cannot download" in done.stderr and "MTPQ_INDEX_URL" in done.stderr


@pytest.mark.parametrize(
    ("pip_conf", "variables", "expected"),
    [
        ("[global]\nindex-url = http://mirror.test/simple/\n", {}, "http://mirror.test/simple"),
        (
            "[global]\nindex-url = http://global.test/simple\n[install]\nindex-url = http://install.test/simple\n",
            {},
            "http://install.test/simple",
        ),
        (
            "[global]\nindex-url = http://mirror.test/simple\n",
            {"PIP_INDEX_URL": "http://env.test/simple"},
            "http://env.test/simple",
        ),
        (
            "[global]\nindex-url = http://mirror.test/simple\n",
            {"MTPQ_INDEX_URL": "http://ours.test/simple"},
            "http://ours.test/simple",
        ),
        (None, {}, DEFAULT_INDEX_URL),
    ],
    ids=[
        "pip-conf",
        "install-section-first",
        "pip-index-url-variable",
        "mtpq-index-url-first",
        "pypi-without-config",
    ],
)
def test_the_default_index_is_the_one_pip_is_configured_with(
    tmp_path, monkeypatch, pip_conf, variables, expected
):
    for name in ("MTPQ_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "pip.conf"
    if pip_conf is None:
        config = os.devnull  # pip then reads no configuration file at all
    else:
        config.write_text(pip_conf)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    assert index_url() == expected
    environment = pip_environment()  # the test bed's pip: that index alone, no other configuration
    assert environment["PIP_INDEX_URL"] == expected and environment["PIP_CONFIG_FILE"] == os.devnull
