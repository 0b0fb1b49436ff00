"""A BF16 MTP draft against the same draft quantized online by draft_quant_config (vLLM's online schemes):
the draft's own weight bytes (embeddings and LM head are the target's), its step time (wall time of
one draft-model forward), output tokens/s and acceptance, on the engineered checkpoints (INT8 W8A8 main
layers, BF16 MTP layer).

Runs as it is on the CPU test bed and on a CUDA machine, with an interpreter whose vLLM has the series
(`python3 tests/run.py --venv` prints the CPU test bed; on a GPU machine `python3 apply.py --installed`
patches its vLLM). It picks the schemes for the machine: on the CPU every online shorthand of the
installed vLLM (most are refused there, and the table says why); on CUDA FP8 per-block, MXFP8 and NVFP4
(per-token, MoE only: Blackwell). Engines run in-process, eager, one after another. Prints figures,
asserts nothing.

  <venv>/bin/python -m benchmarks.online_draft_quantization [--max-tokens N] [--prompts N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import checkpoints
from tests.e2e_cases import MTP
from tests.probing import probe_pythonpath

ROOT = Path(__file__).resolve().parent.parent

# One dense and one MoE MTP layer: the online schemes cover linear layers, MoE experts or both.
DENSE_AND_MOE = ("mimo", "glm4_moe")
BF16_DRAFT = "unquantized"
# Linear layers only, --quantization-config's form: on MoE drafts the CPU has no online FP8 MoE kernel.
FP8_LINEAR_ONLY = {"online_config": {"linear": "fp8_per_channel"}}
GPU_SCHEMES = ("fp8_per_block", "mxfp8", "nvfp4_per_token")


def schemes(on_gpu: bool) -> list:
    from vllm.config.quantization import ONLINE_QUANT_SHORTHAND_NAMES

    # "online" alone names no scheme: its fields come in online_config.
    names = GPU_SCHEMES if on_gpu else sorted(set(ONLINE_QUANT_SHORTHAND_NAMES) - {"online"})
    return [BF16_DRAFT, *({"online": name} for name in names), FP8_LINEAR_ONLY]


def label(option) -> str:
    return option if isinstance(option, str) else json.dumps(option)


def run_engines(batch: dict) -> dict:
    """The engine runs of one probe process (tests/probes/engine_acceptance.py) under this interpreter."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "probes" / "engine_acceptance.py"), json.dumps(batch)],
        capture_output=True,
        text=True,
        cwd=ROOT / "tests",
        env={**os.environ, "PYTHONPATH": probe_pythonpath()},
    )
    if done.returncode != 0:
        raise SystemExit(f"engine probe failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["runs"]


def row(report: dict) -> str:
    if "error" in report:
        return f"refused: {report['error'][:150]}"
    own_bytes = sum(rank["own_weight_bytes"] for rank in report["draft_ranks"])
    forwards = [seconds for rank in report["draft_forward_s"] for seconds in rank]
    tokens_per_s = sum(map(len, report["outputs"])) / report["generate_s"]
    methods = sorted(
        {m for rank in report["draft_ranks"] for m in rank["linears"].values() if m.endswith("Method")}
    )
    return (
        f"{own_bytes:>11,} {1000 * statistics.median(forwards):>9.3f} {tokens_per_s:>8.1f}"
        f" {report['acceptance']:>6.3f}  {', '.join(methods)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128, help="per prompt")
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    import torch

    on_gpu = torch.cuda.is_available()
    prompts = checkpoints.default_prompts(args.prompts)
    with tempfile.TemporaryDirectory(prefix="mtpq-online-") as scratch:
        batch = {}
        for arch in DENSE_AND_MOE:
            model = checkpoints.make_checkpoint(
                checkpoints.CHECKPOINT_ARCHITECTURES[arch], Path(scratch) / arch, "int8_w8a8"
            )
            for option in schemes(on_gpu):
                batch[f"{arch}|{label(option)}"] = {
                    "model": str(model),
                    "speculative_config": {**MTP, "draft_quant_config": option},
                    "prompts": prompts,
                    "max_tokens": args.max_tokens,
                    "warmup": True,
                    "time_draft": True,
                }
        reports = run_engines(batch)
    device = torch.cuda.get_device_name() if on_gpu else "CPU"
    print(
        f"MTP draft BF16 ({BF16_DRAFT!r}) vs quantized online, {device}, INT8 W8A8 target with a BF16 MTP"
        f" layer, MTP k={MTP['num_speculative_tokens']}, {len(prompts)} prompts x {args.max_tokens} tokens,"
        " in-process, eager, after one warm-up"
    )
    print(
        f"  {'draft_quant_config':48} {'draft bytes':>11} {'step ms':>9} {'tok/s':>8} {'accept':>6}"
        "  draft's methods"
    )
    for name, report in reports.items():
        arch, option = name.split("|", 1)
        print(f"  {arch + ' ' + option:48} {row(report)}", flush=True)


if __name__ == "__main__":
    main()
