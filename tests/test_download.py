"""Pinned downloads: sha256-verified against VLLM_VERSIONS, cached, failing closed."""

from __future__ import annotations

import hashlib

import pytest

from mtpq.download import DownloadError, fetch
from mtpq.pin import Artifact

GOOD = b"the pinned artifact\n"


ARTIFACT = Artifact("demo", "demo-1.0.tar.gz", hashlib.sha256(GOOD).hexdigest())


def test_verified_download_is_cached_and_reused_offline(index, monkeypatch):
    index.serve("demo", ARTIFACT.filename, GOOD)
    path = fetch(ARTIFACT)
    assert path.read_bytes() == GOOD and path.parent == index.cache / "downloads"
    monkeypatch.setenv("MTPQ_INDEX_URL", "http://127.0.0.1:9")  # nothing listens there
    assert fetch(ARTIFACT) == path


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
    assert not (index.cache / "src").exists()
    assert not (index.cache / "downloads" / sdist.filename).exists()


def test_apply_offline_with_an_empty_cache_says_so(run_apply, tmp_path):
    done = run_apply(env={"MTPQ_INDEX_URL": "http://127.0.0.1:9", "MTPQ_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 2 and "cannot download" in done.stderr and "MTPQ_INDEX_URL" in done.stderr
