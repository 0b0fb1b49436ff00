"""`python -m mtpq graft`: a quantized checkpoint plus a BF16 release's MTP layer, on real layouts
described by headers (header_checkpoints.py). The grafted engineered checkpoints meet the real engine
in test_e2e_mtp_acceptance.py and test_e2e_doctor.py.
"""

from __future__ import annotations

import hashlib
import json
import resource
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from mtpq.checkpoint import graft as grafting
from mtpq.checkpoint.doctor import WORKS, diagnose
from mtpq.checkpoint.reader import read_checkpoint
from tests.commands import run_mtpq
from tests.conftest import ROOT
from tests.header_checkpoints import (
    DSV3_FP8_CONFIG,
    INDEX_FILE,
    LAYOUTS,
    compressed_tensors,
    write_checkpoint,
)

MTP_FIELDS = {
    "mimo": ["num_nextn_predict_layers"],
    "qwen3_5": ["mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"],
}


def export(layout, directory: Path, quantization: dict, shards: int = 1, **options) -> Path:
    """The checkpoint a quantizer writes: the main model only, its config without the MTP fields."""
    config = json.loads(json.dumps(layout.config))
    holder = layout.count_holder(config)
    holder["quantization_config"] = quantization
    for field in [name for name in holder if "mtp" in name or "nextn" in name]:
        del holder[field]
    tensors = layout.main("int8")
    names = sorted(tensors)
    parts = {f"model-{i}.safetensors": {n: tensors[n] for n in names[i::shards]} for i in range(shards)}
    write_checkpoint(directory, config, parts, **options)
    (directory / "tokenizer.json").write_text("{}")
    return directory


def bf16_release(layout, directory: Path, mtp_shard: bool = False) -> Path:
    """The BF16 release, MTP tensors with distinct bytes (to check the copy), in a shard of their own."""
    main, mtp = layout.main("bf16"), layout.mtp("bf16")
    data = {
        name: hashlib.sha256(name.encode()).digest() * (_nbytes(info) // 32 + 1) for name, info in mtp.items()
    }
    data = {name: payload[: _nbytes(mtp[name])] for name, payload in data.items()}
    shards = (
        {"model-a.safetensors": main, "model-mtp.safetensors": mtp}
        if mtp_shard
        else {"model.safetensors": main | mtp}
    )
    return write_checkpoint(directory, layout.config, shards, data=data)


def _nbytes(info) -> int:
    dtype, shape = info
    size = {"BF16": 2, "F32": 4}[dtype]
    for dim in shape:
        size *= dim
    return size


def tensor_bytes(directory: Path) -> dict[str, bytes]:
    """Every tensor's data in a checkpoint, by name."""
    found = {}
    for path in directory.glob("*.safetensors"):
        raw = path.read_bytes()
        length = int.from_bytes(raw[:8], "little")
        for name, entry in json.loads(raw[8 : 8 + length]).items():
            if name != "__metadata__":
                begin, end = entry["data_offsets"]
                found[name] = raw[8 + length + begin : 8 + length + end]
    return found


def snapshot(*directories: Path) -> dict:
    return {
        str(path): (path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
        for directory in directories
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize(
    ("name", "shards", "mtp_shard"),
    [("mimo", 1, False), ("qwen3_5", 3, True), ("deepseek_v3", 2, True)],
    ids=["mimo-single-file", "qwen3_5-sharded", "deepseek_v3-sharded"],
)
def test_graft_adds_the_mtp_layer_maps_every_tensor_and_leaves_the_inputs_alone(
    tmp_path, name, shards, mtp_shard
):
    layout = LAYOUTS[name]
    quantization = compressed_tensors("int8", ["lm_head"])
    quant = export(layout, tmp_path / "quant", quantization, shards, index=shards > 1)
    source = bf16_release(layout, tmp_path / "bf16", mtp_shard)
    before = snapshot(quant, source)

    done = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "new")

    assert done.returncode == 0, done.stderr
    assert snapshot(quant, source) == before
    new = tmp_path / "new"
    grafted = read_checkpoint(new)
    assert grafted.coverage.complete and grafted.index.keys() == grafted.tensors.keys()
    index = json.loads((new / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == grafted.tensor_bytes
    mtp = layout.mtp("bf16")
    assert {n for n, f in grafted.index.items() if f == grafting.MTP_FILE} == set(mtp)
    copied, originals = tensor_bytes(new), tensor_bytes(source)
    assert all(copied[n] == originals[n] for n in mtp)
    config = json.loads((new / "config.json").read_text())
    holder, original = layout.count_holder(config), layout.count_holder(layout.config)
    assert holder["quantization_config"] == quantization
    assert {field: holder[field] for field in MTP_FIELDS.get(name, [])} == {
        field: original[field] for field in MTP_FIELDS.get(name, [])
    }
    for path in quant.glob("*.safetensors"):  # unchanged files are links, not copies
        assert (new / path.name).stat().st_ino == path.stat().st_ino
    assert (new / "tokenizer.json").read_text() == "{}"
    verdicts = diagnose(new).verdicts
    assert {v["patched"].kind for v in verdicts.values()} == {WORKS}
    assert done.stdout.startswith(f"wrote {new}: ")


def test_graft_supplies_the_mtp_file_an_index_names_but_the_release_lacks(tmp_path):
    """Seed 000: the FP8 release's index maps MTP tensors to model_mtp.safetensors, which it lacks."""
    layout = LAYOUTS["mimo"]
    quant = export(layout, tmp_path / "quant", DSV3_FP8_CONFIG, index=True)
    index = json.loads((quant / INDEX_FILE).read_text())
    index["weight_map"] |= dict.fromkeys(layout.mtp("bf16"), "model_mtp.safetensors")
    (quant / INDEX_FILE).write_text(json.dumps(index))
    assert diagnose(quant).verdicts["0.33.0"]["patched"].kind == "MTP silently off"

    done = run_mtpq(
        "graft", "--mtp-from", bf16_release(layout, tmp_path / "bf16"), quant, "--out", tmp_path / "new"
    )

    assert done.returncode == 0, done.stderr
    assert read_checkpoint(tmp_path / "new").coverage.complete


def graft_for_stock_vllm(layout, quant: Path, tmp_path: Path, version: str):
    """`graft --stock-vllm VERSION` from the layout's BF16 release into tmp_path/new."""
    source = bf16_release(layout, tmp_path / "bf16")
    return run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "new", "--stock-vllm", version)


def test_stock_vllm_gets_ignore_entries_under_its_draft_names(tmp_path):
    layout = LAYOUTS["mimo"]
    quant = export(layout, tmp_path / "quant", compressed_tensors("int8", ["lm_head"]))

    done = graft_for_stock_vllm(layout, quant, tmp_path, "0.22.1")

    assert done.returncode == 0, done.stderr
    ignore = json.loads((tmp_path / "new" / "config.json").read_text())["quantization_config"]["ignore"]
    assert ignore[0] == "lm_head" and "model.layers.2.self_attn.q_proj" in ignore  # MiMo's draft names
    assert not [entry for entry in ignore if "mtp_layers" in entry]
    assert "stock vLLM 0.22.1: 7 ignore entries added under the draft's names" in done.stdout
    assert diagnose(tmp_path / "new", ["0.22.1"]).verdicts["0.22.1"]["stock"].kind == WORKS


@pytest.mark.parametrize(
    ("name", "quantization", "reason"),
    [
        (
            "step3p5",
            compressed_tensors("int8", ["lm_head"]),
            "Step-3.5 MTP loader refuses every compressed-tensors",
        ),
        ("mimo", DSV3_FP8_CONFIG, "only compressed-tensors ignore lists are written, not fp8"),
        (
            "deepseek_v4",
            compressed_tensors("int8", ["lm_head"]),
            "draft builds its modules under are not known here",
        ),
    ],
    ids=["step3p5-strict-loader", "fp8", "deepseek_v4"],
)
def test_where_ignore_entries_cannot_serve_stock_vllm_graft_says_so(tmp_path, name, quantization, reason):
    layout = LAYOUTS[name]
    quant = export(layout, tmp_path / "quant", quantization)

    done = graft_for_stock_vllm(layout, quant, tmp_path, "0.22.1")

    assert done.returncode == 1
    assert "stock vLLM 0.22.1 cannot serve its MTP: " in done.stdout and reason in done.stdout
    assert "vLLM with the mtpq series can" in done.stdout and (tmp_path / "new" / "config.json").exists()


def _other(field: str, value):
    return lambda config: {**config, field: value}


BAD_SOURCES = {
    "architecture": (
        lambda config: {**config, "architectures": ["Qwen2ForCausalLM"]},
        "architectures[0] is Qwen2ForCausalLM",
    ),
    "hidden-size": (_other("hidden_size", 4096), "hidden_size is 4096, QUANT_CKPT's is 64"),
    "vocab": (_other("vocab_size", 1000), "vocab_size is 1000, QUANT_CKPT's is 256"),
    "layer-count": (_other("num_hidden_layers", 3), "num_hidden_layers is 3, QUANT_CKPT's is 2"),
}


@pytest.mark.parametrize("case", BAD_SOURCES)
def test_a_source_of_another_model_is_refused_naming_the_field(tmp_path, case):
    change, words = BAD_SOURCES[case]
    layout = LAYOUTS["mimo"]
    source = bf16_release(layout, tmp_path / "bf16")
    (source / "config.json").write_text(json.dumps(change(layout.config)))

    assert_refused(tmp_path, source, export(layout, tmp_path / "quant", DSV3_FP8_CONFIG), words)


def assert_refused(tmp_path: Path, source: Path, quant: Path, words: str, *extra: str) -> None:
    before = snapshot(source, quant)
    done = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "new", *extra)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr
    assert snapshot(source, quant) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (source, quant) if p.parent == tmp_path
    )


def test_a_source_without_mtp_tensors_is_refused(tmp_path):
    layout = LAYOUTS["mimo"]
    source = write_checkpoint(tmp_path / "bf16", layout.config, {"model.safetensors": layout.main("bf16")})
    assert_refused(tmp_path, source, export(layout, tmp_path / "quant", DSV3_FP8_CONFIG), "no MTP tensor")


def test_a_source_with_a_quantized_mtp_layer_is_refused(tmp_path):
    layout = LAYOUTS["mimo"]
    source = write_checkpoint(
        tmp_path / "bf16", layout.config, {"model.safetensors": layout.tensors("bf16", "int8")}
    )
    assert_refused(tmp_path, source, export(layout, tmp_path / "quant", DSV3_FP8_CONFIG), "are quantized")


def test_a_checkpoint_that_has_its_mtp_layer_is_refused(tmp_path):
    layout = LAYOUTS["mimo"]
    quant = write_checkpoint(tmp_path / "quant", layout.config, {"model.safetensors": layout.tensors("int8")})
    assert_refused(tmp_path, bf16_release(layout, tmp_path / "bf16"), quant, "already holds MTP tensors")


def test_a_truncated_source_header_is_refused_naming_the_file(tmp_path):
    layout = LAYOUTS["mimo"]
    source = bf16_release(layout, tmp_path / "bf16")
    with open(source / "model.safetensors", "r+b") as file:
        file.truncate(50)
    quant = export(layout, tmp_path / "quant", DSV3_FP8_CONFIG)
    assert_refused(tmp_path, source, quant, f"--mtp-from: {source / 'model.safetensors'}")


def test_not_a_checkpoint_is_refused(tmp_path):
    layout = LAYOUTS["mimo"]
    (tmp_path / "empty").mkdir()
    assert_refused(
        tmp_path, tmp_path / "empty", export(layout, tmp_path / "quant", DSV3_FP8_CONFIG), "no config.json"
    )


def test_an_existing_output_is_kept_unless_forced(tmp_path):
    layout = LAYOUTS["mimo"]
    source, quant = (
        bf16_release(layout, tmp_path / "bf16"),
        export(layout, tmp_path / "quant", DSV3_FP8_CONFIG),
    )
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "mine").write_text("keep")

    refused = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "new")
    forced = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "new", "--force")

    assert refused.returncode == 2 and "exists; --force replaces it" in refused.stderr
    assert forced.returncode == 0 and not (tmp_path / "new" / "mine").exists()
    assert read_checkpoint(tmp_path / "new").coverage.complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16", "new", "quant"]


def test_an_output_inside_an_input_is_refused(tmp_path):
    layout = LAYOUTS["mimo"]
    source, quant = (
        bf16_release(layout, tmp_path / "bf16"),
        export(layout, tmp_path / "quant", DSV3_FP8_CONFIG),
    )
    done = run_mtpq("graft", "--mtp-from", source, quant, "--out", quant / "new", "--force")
    assert done.returncode == 2 and "overlaps the input" in done.stderr and not (quant / "new").exists()


def test_a_write_that_fails_midway_leaves_nothing_behind(tmp_path):
    """A disk that fills up while the MTP tensors are copied: the file-size limit fails the write."""
    layout = LAYOUTS["mimo"]
    source, quant = (
        bf16_release(layout, tmp_path / "bf16"),
        export(layout, tmp_path / "quant", DSV3_FP8_CONFIG),
    )
    before = snapshot(source, quant)

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    out = tmp_path / "a" / "new"  # its parent, made for it, goes too
    done = subprocess.run(
        [sys.executable, "-S", "-m", "mtpq", "graft", "--mtp-from", source, quant, "--out", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        preexec_fn=small_disk,
    )

    assert done.returncode == 2 and "failed (" in done.stderr and "nothing was written" in done.stderr
    assert done.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16", "quant"]
    assert snapshot(source, quant) == before


def test_memory_stays_within_the_largest_mtp_tensor(tmp_path):
    layout = LAYOUTS["deepseek_v3"]
    big = {"model.layers.3.mlp.experts.0.up_proj.weight": ("BF16", [2048, 4096])}  # 16 MiB
    huge_main = {"model.layers.0.mlp.experts.1.up_proj.weight": ("BF16", [8192, 8192])}  # 128 MiB
    source = write_checkpoint(
        tmp_path / "bf16", layout.config, {"m.safetensors": layout.tensors("bf16") | big | huge_main}
    )
    quant = export(layout, tmp_path / "quant", DSV3_FP8_CONFIG)

    tracemalloc.start()
    try:
        grafting.graft(source, quant, tmp_path / "new")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert 16 * 2**20 <= peak < 24 * 2**20


# --- what a new user meets -------------------------------------------------------------------------


def mimo_pair(tmp_path: Path) -> tuple[Path, Path]:
    layout = LAYOUTS["mimo"]
    quant = export(layout, tmp_path / "quant", compressed_tensors("int8", ["lm_head"]))
    return bf16_release(layout, tmp_path / "bf16"), quant


def graft_help() -> str:
    """`graft --help` without whitespace: argparse wraps (and splits hyphenated words) at any column."""
    return "".join(run_mtpq("graft", "--help").stdout.split())


def squeezed(words: str) -> str:
    return "".join(words.split())


def test_missing_parents_of_the_output_are_created(tmp_path):
    source, quant = mimo_pair(tmp_path)
    done = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "a" / "b" / "new")
    assert done.returncode == 0, done.stderr
    assert read_checkpoint(tmp_path / "a" / "b" / "new").coverage.complete


def test_hard_links_are_said_and_copy_copies(tmp_path):
    source, quant = mimo_pair(tmp_path)
    help_text = graft_help()
    linked = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "linked")
    copied = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "copied", "--copy")

    assert squeezed("hard-linked, not copied, unless --copy") in help_text
    assert squeezed("changes QUANT_CKPT too") in help_text
    assert (
        "hard-linked from" in linked.stdout and "editing one in place changes QUANT_CKPT too" in linked.stdout
    )
    assert "copied from" in copied.stdout and copied.returncode == 0
    shard = quant / "model-0.safetensors"
    assert (tmp_path / "linked" / shard.name).stat().st_ino == shard.stat().st_ino
    assert (tmp_path / "copied" / shard.name).stat().st_ino != shard.stat().st_ino
    assert (tmp_path / "copied" / shard.name).read_bytes() == shard.read_bytes()


def test_the_last_line_tells_what_vllm_still_needs(tmp_path):
    source, quant = mimo_pair(tmp_path)
    plain = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "plain")
    stock = run_mtpq(
        "graft", "--mtp-from", source, quant, "--out", tmp_path / "stock", "--stock-vllm", "0.22.1"
    )

    assert plain.returncode == 0 and "stock silent 0 % acceptance" in plain.stdout
    assert plain.stdout.splitlines()[-1].startswith("still needed: vLLM ")
    assert "with the mtpq series (python apply.py --installed" in plain.stdout.splitlines()[-1]
    assert "--stock-vllm VERSION" in plain.stdout.splitlines()[-1]
    assert stock.returncode == 0 and stock.stdout.splitlines()[-1] == (
        "ready: stock vLLM 0.22.1 serves its MTP layers"
    )


def test_help_names_every_argument_and_the_exit_codes():
    help_text = " ".join(run_mtpq("graft", "--help").stdout.split())
    assert "QUANT_CKPT the quantized checkpoint directory" in help_text
    assert "--out NEW_CKPT the new checkpoint directory (its missing parents are created" in help_text
    assert (
        "Exit code: 0 written, 1 written but --stock-vllm's release cannot serve it, 2 bad input" in help_text
    )


def test_json_says_what_the_text_says(tmp_path):
    source, quant = mimo_pair(tmp_path)
    done = run_mtpq("graft", "--mtp-from", source, quant, "--out", tmp_path / "new", "--json")

    report = json.loads(done.stdout)
    assert done.returncode == report["exit_code"] == 0
    assert report["out"] == str(tmp_path / "new") and report["mtp_file"] == grafting.MTP_FILE
    assert report["mtp_tensors"] == len(LAYOUTS["mimo"].mtp("bf16"))
    assert report["unchanged_files_are"] == "hard links"
    assert {kinds["patched"] for kinds in report["doctor"].values()} == {WORKS}
    assert report["still_needed"].startswith("still needed: vLLM ")
