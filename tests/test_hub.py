"""`mtpq doctor ORG/NAME` and `mtpq graft --mtp-from ORG/NAME` against a local server that answers as
the Hub does (hub_server.py), through the real huggingface_hub pointed at it with HF_ENDPOINT: the same
verdicts as for the same checkpoint on disk, only config files, the index, MTP shards' headers and (for
graft) MTP tensors' bytes fetched, and the Hub's failures as one-line errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtpq.core.download import cache_root, pip_environment
from tests.commands import run_mtpq
from tests.conftest import ROOT
from tests.header_checkpoints import (
    DSV3_FP8_CONFIG,
    INDEX_FILE,
    LAYOUTS,
    compressed_tensors,
    header_bytes,
    write_checkpoint,
    write_deepseek_v3_shaped,
    write_safetensors,
)
from tests.hub_server import TOKEN, HubServer
from tests.run import READY
from tests.test_doctor import export_without_mtp, quantized
from tests.test_graft import bf16_release, export, tensor_bytes

pytest.importorskip("huggingface_hub")  # the test bed has it; `pip install 'mtpq[hub]'` elsewhere

CONFIG_FILES = ("config.json", INDEX_FILE)


@pytest.fixture
def hub(tmp_path_factory):
    server = HubServer()
    server.hf_home = tmp_path_factory.mktemp("hf-home")  # no cached login
    yield server
    server.stop()


def hub_env(hub: HubServer, token: str | None = None) -> dict[str, str]:
    """The environment of a user whose huggingface_hub talks to the local server: no cached login,
    no proxy for loopback, a token only when given."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env |= {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(hub.hf_home), "NO_PROXY": "127.0.0.1"}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    if token:
        env["HF_TOKEN"] = token
    return env


def run_remote(hub: HubServer, *args, token: str | None = None, python: str = sys.executable):
    return subprocess.run(
        [python, "-m", "mtpq", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=hub_env(hub, token),
    )


def same_judgement(local: dict, remote: dict, directory: Path, repo: str) -> None:
    """Verdicts, fixes and MTP facts alike. Errors alike but for the location's name (and what the
    series' local survey adds to it: the files it searched) and the survey's count of headers read."""
    assert remote["exit_code"] == local["exit_code"]
    for key in ("architecture", "mtp_architecture", "declared", "quantization", "mtp_tensors"):
        assert remote[key] == local[key], key
    for version, judged in local["releases"].items():
        for flavour in ("stock", "patched"):
            ours, theirs = judged[flavour], remote["releases"][version][flavour]
            assert theirs["kind"] == ours["kind"], (version, flavour)
            local_error = re.sub(
                r" \(searched: [^)]*\)", "", (ours["error"] or "").replace(str(directory), "<ckpt>")
            )
            assert (theirs["error"] or "").replace(repo, "<ckpt>") == local_error
            if "headers:" not in ours["why"]:
                assert theirs["why"] == ours["why"]
        assert remote["releases"][version]["fix"] == judged["fix"]


def doctor_both(hub: HubServer, directory: Path, repo: str = "org/ckpt", *extra) -> tuple[dict, dict]:
    hub.add(repo, directory)
    local = run_mtpq("doctor", directory, "--json", *extra)
    remote = run_remote(hub, "doctor", repo, "--json", *extra)
    assert remote.stderr == "" and local.stderr == "", remote.stderr + local.stderr
    return json.loads(local.stdout), json.loads(remote.stdout)


def mtp_shards(directory: Path, layout) -> set[str]:
    index = json.loads((directory / INDEX_FILE).read_text())["weight_map"]
    return {index[name] for name in layout.mtp("bf16")}


# --- the same verdicts as on disk ----------------------------------------------------------------------


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_layout_gets_the_verdicts_it_gets_on_disk_from_its_mtp_shard_alone(tmp_path, hub, name):
    layout = LAYOUTS[name]
    shards = {"model-1.safetensors": layout.main("int8"), "model-2.safetensors": layout.mtp("bf16")}
    write_checkpoint(tmp_path, quantized(layout, compressed_tensors("int8", [])), shards)

    local, remote = doctor_both(hub, tmp_path)

    same_judgement(local, remote, tmp_path, "org/ckpt")
    fetched = hub.served.files()
    assert fetched.keys() == {*CONFIG_FILES, "model-2.safetensors"}
    assert fetched["model-2.safetensors"] == header_bytes(tmp_path / "model-2.safetensors")
    assert remote["read"]["bytes_read"] == sum(fetched.values())
    assert remote["index"]["unread_files"] == ["model-1.safetensors"]
    assert remote["read"]["checkpoint_bytes"] == local["read"]["checkpoint_bytes"]


CASES = {
    "no-mtp-exported": lambda d: export_without_mtp(d, LAYOUTS["qwen3_5"], "fp8"),
    "class-default-count": lambda d: export_without_mtp(d, LAYOUTS["glm4_moe"], "int8"),
    "mtp-file-missing": lambda d: (
        write_checkpoint(
            d,
            quantized(LAYOUTS["deepseek_v3"], DSV3_FP8_CONFIG),
            {
                "model-1.safetensors": LAYOUTS["deepseek_v3"].main("fp8-block"),
                "model_mtp.safetensors": LAYOUTS["deepseek_v3"].mtp("bf16"),
            },
        ),
        (d / "model_mtp.safetensors").unlink(),
    ),
    "quantized-mtp": lambda d: write_checkpoint(
        d,
        quantized(LAYOUTS["deepseek_v3"], DSV3_FP8_CONFIG),
        {"m.safetensors": LAYOUTS["deepseek_v3"].tensors("fp8-block", "fp8-block")},
    ),
    "modelopt-nvfp4": lambda d: (
        write_checkpoint(d, LAYOUTS["mimo"].config, {"model.safetensors": LAYOUTS["mimo"].tensors("bf16")}),
        (d / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}})),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_doctor_cases_get_the_verdicts_they_get_on_disk(tmp_path, hub, case):
    CASES[case](tmp_path)

    local, remote = doctor_both(hub, tmp_path)

    same_judgement(local, remote, tmp_path, "org/ckpt")
    assert remote["read"]["bytes_read"] == sum(hub.served.files().values())


def test_a_revision_and_a_url_name_the_same_checkpoint(tmp_path, hub):
    layout = LAYOUTS["mimo"]
    write_checkpoint(
        tmp_path, quantized(layout, compressed_tensors("int8", [])), {"m.safetensors": layout.tensors("int8")}
    )
    repo = hub.add("org/ckpt", tmp_path, revisions=("main", "v1"))

    by_id = json.loads(run_remote(hub, "doctor", "org/ckpt@v1", "--json").stdout)
    by_url = json.loads(
        run_remote(hub, "doctor", f"{hub.endpoint}/org/ckpt/tree/{repo.commit}", "--json").stdout
    )

    assert by_id["checkpoint"] == "org/ckpt@v1" and by_url["checkpoint"].endswith(f"org/ckpt@{repo.commit}")
    assert by_id["releases"] == by_url["releases"] and by_id["exit_code"] == 1
    assert any(path.startswith("/api/models/org/ckpt/revision/v1") for path in hub.served.requests)


def test_a_deepseek_v3_sized_release_costs_its_index_and_the_mtp_shards_headers(tmp_path, hub):
    """188 shards of 667 GiB (sparse): the index is read whole, of the shards only the MTP layer's headers."""
    write_deepseek_v3_shaped(tmp_path, shards_per_layer=3)
    shards = sorted(tmp_path.glob("*.safetensors"))
    mtp = sorted(path for path in shards if path.name.startswith("model-61-"))
    hub.add("deepseek-ai/DeepSeek-V3", tmp_path)

    started = time.perf_counter()
    done = run_remote(hub, "doctor", "deepseek-ai/DeepSeek-V3", "--json")
    elapsed = time.perf_counter() - started

    report = json.loads(done.stdout)
    configs = sum((tmp_path / file).stat().st_size for file in CONFIG_FILES)
    assert len(shards) == 188 and done.returncode == 0, done.stderr
    assert hub.served.files() == {
        "config.json": (tmp_path / "config.json").stat().st_size,
        INDEX_FILE: (tmp_path / INDEX_FILE).stat().st_size,
        **{path.name: header_bytes(path) for path in mtp},
    }
    assert report["read"]["bytes_read"] == configs + sum(header_bytes(path) for path in mtp)
    assert report["read"]["checkpoint_bytes"] == sum(path.stat().st_size for path in shards)
    assert elapsed < 30, elapsed
    print(f"\nDeepSeek-V3-sized, {len(shards)} shards: {hub.served.total} bytes served, {elapsed:.2f} s")


# --- the Hub's failures ---------------------------------------------------------------------------------


def small_checkpoint(directory: Path) -> Path:
    layout = LAYOUTS["mimo"]
    config = quantized(layout, compressed_tensors("int8", []))
    return write_checkpoint(directory, config, {"model.safetensors": layout.tensors("int8")})


def assert_one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("options", "token", "words"),
    [
        ({"gated": True}, None, ("gated repository", "accept its terms", "HF_TOKEN")),
        ({"gated": True}, "hf_someone_else", ("gated repository", "accept its terms")),
        ({"private": True}, None, ("no repository org/ckpt", "private", "HF_TOKEN")),
    ],
    ids=["gated-no-token", "gated-terms-not-accepted", "private-no-token"],
)
def test_a_repository_out_of_reach_says_what_to_do(tmp_path, hub, options, token, words):
    hub.add("org/ckpt", small_checkpoint(tmp_path), **options)

    assert_one_line_error(run_remote(hub, "doctor", "org/ckpt", token=token), *words)
    granted = run_remote(hub, "doctor", "org/ckpt", token=TOKEN)  # HF_TOKEN reaches the server
    assert granted.returncode == 1 and "silent 0 % acceptance" in granted.stdout, granted.stderr


def test_an_unknown_repository_or_revision_is_one_line(tmp_path, hub):
    hub.add("org/ckpt", small_checkpoint(tmp_path))

    assert_one_line_error(run_remote(hub, "doctor", "org/other"), "no repository org/other")
    assert_one_line_error(run_remote(hub, "doctor", "org/ckpt@v9"), "has no revision 'v9'")


def test_a_server_that_ignores_range_is_refused_not_downloaded(tmp_path, hub):
    layout = LAYOUTS["mimo"]
    big = {"model.layers.0.mlp.experts.1.up_proj.weight": ("BF16", [8192, 8192])}  # 128 MiB hole
    write_checkpoint(tmp_path, layout.config, {"model.safetensors": layout.tensors("bf16") | big})
    hub.add("org/ckpt", tmp_path, ignore_range=True)

    done = run_remote(hub, "doctor", "org/ckpt")

    assert_one_line_error(done, "config.json", "not 206 Partial Content", "refusing to download")
    assert hub.served.total < 16 * 2**20  # what the socket took before the client hung up


@pytest.mark.parametrize(
    ("declared", "size", "words"),
    [
        (10**6, 4096, "header length 1000000 does not fit a 4096-byte file"),
        (2**30, 2**31, "at most 100000000"),
    ],
    ids=["truncated", "oversized"],
)
def test_a_bad_header_length_is_refused_before_the_header_is_fetched(tmp_path, hub, declared, size, words):
    layout = LAYOUTS["mimo"]
    write_checkpoint(tmp_path, layout.config, {"model.safetensors": layout.tensors("bf16")})
    with open(tmp_path / "model.safetensors", "r+b") as file:
        file.write(declared.to_bytes(8, "little"))
        file.truncate(size)
    hub.add("org/ckpt", tmp_path)

    assert_one_line_error(run_remote(hub, "doctor", "org/ckpt"), "org/ckpt/model.safetensors", words)
    assert hub.served.files()["model.safetensors"] == 8


def test_a_malformed_header_is_named_as_the_local_check_names_it(tmp_path, hub):
    layout = LAYOUTS["mimo"]
    write_safetensors(tmp_path / "model.safetensors", layout.tensors("bf16"))
    with open(tmp_path / "model.safetensors", "r+b") as file:
        file.seek(8)
        file.write(b"[")  # the JSON is no object
    (tmp_path / "config.json").write_text(json.dumps(layout.config))

    local = run_mtpq("doctor", tmp_path)
    hub.add("org/ckpt", tmp_path)
    remote = run_remote(hub, "doctor", "org/ckpt")

    assert_one_line_error(remote, "org/ckpt/model.safetensors: ")
    what = "model.safetensors: "
    assert remote.stderr.partition(what)[2] == local.stderr.partition(what)[2] != ""


def test_a_dropped_connection_is_read_again_then_named(tmp_path, hub):
    repo = hub.add("org/ckpt", small_checkpoint(tmp_path), drop_after=4, drops=2)

    recovered = run_remote(hub, "doctor", "org/ckpt")
    repo.drops = 1000
    failed = run_remote(hub, "doctor", "org/ckpt")

    assert recovered.returncode == 1 and "silent 0 % acceptance" in recovered.stdout, recovered.stderr
    assert_one_line_error(failed, "org/ckpt/config.json", "could not be read", "4 of ")


def test_without_huggingface_hub_a_remote_checkpoint_is_one_line(tmp_path, hub):
    hub.add("org/ckpt", small_checkpoint(tmp_path))

    done = run_mtpq("doctor", "org/ckpt")  # -S: the standard library alone

    assert_one_line_error(done, "huggingface_hub 1.0 or newer", "pip install '.[hub]'", "git+")
    assert run_mtpq("doctor", tmp_path).returncode == 1  # a local directory needs nothing more


# --- graft from the Hub ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mtp_shard", [False, True], ids=["mtp-in-the-trunk-shard", "mtp-shard"])
def test_graft_fetches_only_the_mtp_tensors_bytes(tmp_path, hub, mtp_shard):
    layout = LAYOUTS["deepseek_v3"]
    source = bf16_release(layout, tmp_path / "bf16", mtp_shard)
    trunk_file = "model-a.safetensors" if mtp_shard else "model.safetensors"
    big = {"model.layers.0.mlp.experts.1.up_proj.weight": ("BF16", [8192, 8192])}  # 128 MiB of trunk
    main = layout.main("bf16") | big
    if mtp_shard:
        write_safetensors(source / trunk_file, main)
    else:  # the trunk and the MTP layer in one shard
        write_safetensors(source / trunk_file, main | layout.mtp("bf16"), _mtp_data(source))
    quant = export(layout, tmp_path / "quant", compressed_tensors("int8", ["lm_head"]))
    hub.add("org/bf16", source)
    originals = tensor_bytes(source)

    done = run_remote(hub, "graft", "--mtp-from", "org/bf16", quant, "--out", tmp_path / "new")

    assert done.returncode == 0, done.stderr
    mtp = layout.mtp("bf16")
    copied = tensor_bytes(tmp_path / "new")
    assert all(copied[name] == originals[name] for name in mtp)
    mtp_file = "model-mtp.safetensors" if mtp_shard else trunk_file
    mtp_bytes = sum(len(originals[name]) for name in mtp)
    fetched = hub.served.files()
    assert fetched.pop(mtp_file) == header_bytes(source / mtp_file) + mtp_bytes
    assert fetched.keys() <= set(CONFIG_FILES)  # the trunk's own shard: not even its header
    assert "doctor: vLLM 0.33.0: stock" in done.stdout


def _mtp_data(source: Path) -> dict[str, bytes]:
    """The MTP tensors' distinct bytes bf16_release wrote, to write them again beside a bigger trunk."""
    return {name: data for name, data in tensor_bytes(source).items() if name.startswith("model.layers.3.")}


def test_a_graft_whose_download_fails_leaves_nothing(tmp_path, hub):
    layout = LAYOUTS["mimo"]
    source = bf16_release(layout, tmp_path / "bf16")
    quant = export(layout, tmp_path / "quant", DSV3_FP8_CONFIG)
    repo = hub.add("org/bf16", source)
    # config and header reads are shorter than this; every tensor read after them is cut short
    repo.drop_after, repo.drops = header_bytes(source / "model.safetensors") + 64, 1000

    done = run_remote(hub, "graft", "--mtp-from", "org/bf16", quant, "--out", tmp_path / "new")

    assert_one_line_error(done, "org/bf16/model.safetensors", "nothing was written")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bf16", "quant"]


# --- pip install '.[hub]' ---------------------------------------------------------------------------

PROJECT_FILES = ("pyproject.toml", "README.md", "VLLM_VERSIONS", "apply.py", "mtpq", "patches")


def installed_venv(tmp_path: Path) -> Path:
    """A fresh virtualenv (no system site-packages) with `pip install '.[hub]'` of this checkout. Its
    dependencies are installed once and the venv kept in the mtpq cache, keyed by pyproject.toml;
    mtpq itself is reinstalled from a copy of the checkout every time."""
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + sys.version.encode()).hexdigest()[:12]
    venv = cache_root() / "install-test" / f"venv-{key}"
    source = tmp_path / "source"
    source.mkdir()
    for name in PROJECT_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-qq"]
    if not (venv / READY).exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([*pip, f"{source}[hub]"], check=True, env=pip_environment())
        (venv / READY).touch()
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(source)], check=True, env=pip_environment())
    return venv


def series_files(root: Path) -> dict[str, bytes]:
    files = (path for path in (root / "patches").rglob("*") if path.is_file())
    return {str(path.relative_to(root)): path.read_bytes() for path in files}


def test_pip_install_with_the_hub_extra_gives_a_working_mtpq_command(tmp_path, hub):
    venv = installed_venv(tmp_path)
    hub.add("org/ckpt", small_checkpoint(tmp_path / "ckpt"))
    env = hub_env(hub) | {"PYTHONPATH": ""}
    mtpq = [str(venv / "bin" / "mtpq"), "doctor"]

    remote = subprocess.run([*mtpq, "org/ckpt"], cwd=tmp_path, capture_output=True, text=True, env=env)
    local = subprocess.run(
        [*mtpq, str(tmp_path / "ckpt")], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import mtpq, huggingface_hub; print(mtpq.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )

    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # the installed copy
    package = Path(where.stdout.strip()).parent  # carries the pins and the series, not apply.py
    assert (package / "VLLM_VERSIONS").read_bytes() == (ROOT / "VLLM_VERSIONS").read_bytes()
    assert series_files(package) == series_files(ROOT) and not list(package.rglob("apply.py"))
    assert remote.returncode == local.returncode == 1, remote.stderr + local.stderr
    assert "silent 0 % acceptance" in remote.stdout and remote.stdout.startswith("checkpoint    org/ckpt")
    assert (
        remote.stdout.split("\nquantization")[1].split("\nread")[0]
        == local.stdout.split("\nquantization")[1].split("\nread")[0]
    )


# --- a server that misbehaves: a clear error or a bounded retry, never a whole shard ------------------

SHARD = "model.safetensors"


def shard_checkpoint(directory: Path) -> Path:
    """small_checkpoint's tensors beside 128 MiB of trunk (a hole): fetching the shard would show."""
    layout = LAYOUTS["mimo"]
    big = {"model.layers.0.mlp.experts.1.up_proj.weight": ("BF16", [8192, 8192])}
    config = quantized(layout, compressed_tensors("int8", []))
    return write_checkpoint(directory, config, {SHARD: layout.tensors("int8") | big})


def run_faulty(hub: HubServer, directory: Path, timeout: float | None = None, **faults):
    """The doctor on org/ckpt served with `faults` on its shard: (the run, the shard's bytes fetched,
    seconds taken)."""
    hub.add("org/ckpt", directory, fault_file=SHARD, **faults)
    env = hub_env(hub) | ({"MTPQ_HUB_TIMEOUT": str(timeout)} if timeout else {})
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mtpq", "doctor", "org/ckpt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    return done, hub.served.files().get(SHARD, 0), time.perf_counter() - started


def assert_judged(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 1 and "silent 0 % acceptance" in done.stdout and done.stderr == "", done.stderr


def test_a_connection_dropped_mid_header_is_read_again_then_named(tmp_path, hub):
    directory = shard_checkpoint(tmp_path)
    header = header_bytes(directory / SHARD)
    # the 8-byte length read is shorter than the cut; the header's read is cut in its middle
    recovered, fetched, _ = run_faulty(hub, directory, drop_after=header // 2, drops=2)
    assert_judged(recovered)
    assert fetched == 8 + header // 2 + (header - 8)  # the length, the cut header, the header again

    hub.reset_counts()
    failed, fetched, _ = run_faulty(hub, directory, drop_after=header // 2, drops=1000)
    assert_one_line_error(failed, f"org/ckpt/{SHARD}", "could not be read", f"{header // 2} of {header - 8}")
    assert fetched == 8 + 3 * (header // 2)  # three tries of the header, never the data


def test_a_server_slower_than_the_timeout_is_named_after_bounded_retries(tmp_path, hub):
    done, fetched, seconds = run_faulty(hub, shard_checkpoint(tmp_path), timeout=0.5, delay=2.0)

    assert_one_line_error(done, f"org/ckpt/{SHARD}", "no answer from", "within 0.5 s", "MTPQ_HUB_TIMEOUT")
    assert fetched == 0 and seconds < 15, seconds
    assert hub.served.requests.count(f"/org/ckpt/resolve/{hub.repos['org/ckpt'].commit}/{SHARD}") == 3


def test_a_server_error_is_retried_then_named(tmp_path, hub):
    directory = shard_checkpoint(tmp_path)
    recovered, fetched, _ = run_faulty(hub, directory, server_errors=1)
    assert_judged(recovered)
    assert fetched == header_bytes(directory / SHARD)

    hub.reset_counts()
    failed, fetched, _ = run_faulty(hub, directory, server_errors=1000)
    assert_one_line_error(failed, f"org/ckpt/{SHARD}", "HTTP 503")
    assert fetched == 0 and len([path for path in hub.served.requests if path.endswith(SHARD)]) == 3


def test_a_redirect_loop_is_named(tmp_path, hub):
    done, fetched, seconds = run_faulty(hub, shard_checkpoint(tmp_path), redirect_loop=True)

    assert_one_line_error(done, f"org/ckpt/{SHARD}", "redirects in a loop")
    assert fetched == 0 and seconds < 15


def test_a_revision_that_moves_while_read_is_named_not_mixed(tmp_path, hub):
    directory = shard_checkpoint(tmp_path)
    first = hub.add("org/ckpt", directory).commit

    def push_a_commit():  # the branch moves after the config files were read
        if any(path.endswith(SHARD) for path in hub.served.requests):
            (directory / "README.md").write_text("a new commit")

    done, fetched, _ = run_faulty(hub, directory, before_file=push_a_commit)

    assert_one_line_error(done, f"commit {first} is no longer served", "the revision moved", "run again")
    assert fetched == 0 and hub.repos["org/ckpt"].commit != first
    assert all(first in path for path in hub.served.requests if "/resolve/" in path)  # one commit read
