"""The series on a real GPU: engineered tiny checkpoints (tests/checkpoints.py) served by vLLM 0.22.1's
CUDA build, stock and with the series, MTP off and on (k=2), with CUDA graphs (the default) and once
eager, at batch 1 and 16; several engines at once, one process each.

    PYTHONPATH=/tmp/site python3 -m benchmarks.gpu_run --out DIR     # on the host, after gpu_kit install
    python3 -m benchmarks.gpu_run --dry-run --out DIR                # no GPU: what the run imports and
                                                                     # configures, on a pretend H200

Writes DIR/host.json (the machine), DIR/runs.jsonl (one line per engine run, as each ends, so a killed
run still returns what finished), DIR/engines.log (each engine's log tail). The runs go in ROWS'
priority order; none starts after the deadline's launch margin and any still running at the deadline is
killed and recorded so. benchmarks/gpu_record.py turns the output into the committed record.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from tests.e2e_cases import Case, EngineRun, baseline, engine_specs

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.22.1"
HOST_SITE = Path("/tmp/site")
UNLISTED = {"ignore_style": "unlisted"}
# Priority order: a run cut short still returns the first rows. Each a quantized target, MTP layer BF16.
ROWS = [
    Case("mimo", "int8_w8a8", "recorded"),  # `ignore` names the MTP layer as the checkpoint does
    Case("mimo", "int8_w8a8", "recorded", UNLISTED),
    Case("mimo", "w4a16", "recorded"),  # Marlin on the GPU
    Case("glm4_moe", "fp8_block", "recorded"),  # FP8 block-scaled trunk; the draft's MoE is BF16
    Case("qwen3_5", "int8_w8a8", "recorded", UNLISTED),
    Case("qwen3_5_moe", "int8_w8a8", "recorded", UNLISTED),
    Case("deepseek_v3", "int8_w8a8", "recorded", UNLISTED),  # multi-head latent attention
]
BATCHES = (16, 1)
MAX_TOKENS = 128
# Each engine's share of the GPU: the KV cache fixed (tiny models, 256-token contexts), so the peak
# memory measured is the model's, its CUDA graphs' and its activations'; the utilization only has to
# pass vLLM's start-up check that this much is free while the other engines hold theirs.
ENGINE_ARGS = {"gpu_memory_utilization": 0.05, "kv_cache_memory_bytes": 512 * 2**20, "max_num_seqs": 16}
WORKERS = 12  # of the host's 16 cores: each engine compiles (Inductor, Triton) on its CPU
DEADLINE_S = 300  # the whole host command within ~6 minutes, the install included
LAUNCH_MARGIN_S = 120  # no engine starts later than this before the deadline: it could not finish
# The GPU engines' sampler imports FlashInfer for top-k/top-p (topk_topp_sampler.py) unless this is 0;
# greedy runs sample natively either way, and FlashInfer's JIT kernels would compile on the host.
ENGINE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


@dataclass(frozen=True)
class GpuRun:
    run: EngineRun
    batch: int
    eager: bool = False

    @property
    def key(self) -> str:
        return f"{self.run.key}:b{self.batch}:{'eager' if self.eager else 'graphs'}"


def plan(rows: list[Case] = ROWS) -> list[GpuRun]:
    """Every engine run, in priority order. Per row: at batch 16 the series MTP on and off, stock MTP on
    and the family's BF16 checkpoint with the series (the acceptance the series must equal); then the
    series MTP on and off at batch 1; for the first row MTP on eager."""
    runs, families = [], set()
    big, small = BATCHES
    for index, case in enumerate(rows):
        runs += [GpuRun(EngineRun("patched", case, speculative), big) for speculative in ({}, None)]
        runs.append(GpuRun(EngineRun("unpatched", case, {}), big))
        if case.arch not in families:
            families.add(case.arch)
            runs.append(GpuRun(EngineRun("patched", baseline(case.arch), {}), big))
        runs += [GpuRun(EngineRun("patched", case, speculative), small) for speculative in ({}, None)]
        if index == 0:
            runs.append(GpuRun(EngineRun("patched", case, {}), big, eager=True))
    return runs


def spec_of(gpu_run: GpuRun, checkpoint_of) -> dict:
    """The engine_acceptance probe's spec for one run (its checkpoint built on first use)."""
    from tests.checkpoints import default_prompts  # torch: the record (gpu_record.py) needs none

    (spec,) = engine_specs([gpu_run.run], checkpoint_of).values()
    spec["engine_args"] = {**spec["engine_args"], **ENGINE_ARGS, "enforce_eager": gpu_run.eager}
    return {**spec, "prompts": default_prompts(gpu_run.batch), "max_tokens": MAX_TOKENS, "warmup": True}


def checkpoint_source(scratch: Path):
    from tests.checkpoints import CheckpointStore

    store = CheckpointStore(lambda name: Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch)), VERSION)
    return lambda case: store(case.quant, case.arch, **case.options)


def pythonpath(variant: str, site: Path) -> str:
    """Stock vLLM: the official files (gpu_kit install's stock dir) first, before the patched site."""
    first = [site.with_name(f"{site.name}-stock")] if variant == "unpatched" else []
    return os.pathsep.join(map(str, [*first, site, ROOT]))


# --- one engine (a process of its own) ------------------------------------------------------------


def engine(spec: dict) -> None:
    """Run the probe's engine in this process and print its report with this process's peak GPU memory."""
    from tests.probes import engine_acceptance

    # A file, not a StringIO: vLLM's suppress_stdout (parallel_state.py) redirects the stdout descriptor.
    with tempfile.TemporaryFile("w+") as captured, redirect_stdout(captured):
        engine_acceptance.main([json.dumps({"run": spec})])
        sys.stdout.flush()
        captured.seek(0)
        verdict = json.loads(captured.read().strip().splitlines()[-1])
    import torch

    peak = torch.cuda.max_memory_reserved() if torch.cuda.is_available() else None
    print(json.dumps({**verdict["runs"]["run"], "vllm_file": verdict["vllm_file"], "peak_gpu_bytes": peak}))


# --- the host run ---------------------------------------------------------------------------------


def host_line() -> dict:
    import torch

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    return {
        "gpu": smi.stdout.strip() or smi.stderr.strip(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class Engines:
    """The engine processes running, each with its run, start time and log."""

    def __init__(self, out: Path, site: Path, scratch: Path):
        self.out, self.site, self.scratch = out, site, scratch
        self.running: dict[subprocess.Popen, tuple[GpuRun, float, Path]] = {}

    def start(self, gpu_run: GpuRun, spec: dict) -> None:
        index = len(list(self.scratch.glob("engine-*.log")))
        log = self.scratch / f"engine-{index}.log"
        env = {
            **os.environ,
            "PYTHONPATH": pythonpath(gpu_run.run.variant, self.site),
            # One compile cache each: engines compiling the same model at once must not share files.
            "VLLM_CACHE_ROOT": str(self.scratch / f"vllm-cache-{index}"),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            **ENGINE_ENV,
        }
        command = [sys.executable, "-m", "benchmarks.gpu_run", "--engine", json.dumps(spec)]
        # Files, not pipes: nothing reads an engine's output until it ends.
        with log.open("w") as stderr, log.with_suffix(".json").open("w") as stdout:
            process = subprocess.Popen(
                command, stdout=stdout, stderr=stderr, env=env, cwd=ROOT, start_new_session=True
            )
        self.running[process] = (gpu_run, time.monotonic(), log)

    def record(self, gpu_run: GpuRun, started: float, log: Path, report: dict) -> None:
        line = {
            "key": gpu_run.key,
            "variant": gpu_run.run.variant,
            "case": gpu_run.run.case.name(),
            "mtp": gpu_run.run.speculative is not None,
            "batch": gpu_run.batch,
            "eager": gpu_run.eager,
            "wall_s": round(time.monotonic() - started, 1),
            **report,
        }
        with (self.out / "runs.jsonl").open("a") as runs:
            runs.write(json.dumps(line) + "\n")
        with (self.out / "engines.log").open("a") as logs:
            logs.write(f"===== {gpu_run.key}\n{log.read_text(errors='replace')[-20000:]}\n")
        print(f"{line['wall_s']:6.1f} s  {gpu_run.key}: {summary(report)}", flush=True)

    def reap(self) -> None:
        for process in [process for process in self.running if process.poll() is not None]:
            gpu_run, started, log = self.running.pop(process)
            lines = log.with_suffix(".json").read_text().strip().splitlines()
            try:
                report = json.loads(lines[-1])
            except (IndexError, json.JSONDecodeError):
                tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                report = {"error": f"engine process exited {process.returncode}: {tail}"}
            self.record(gpu_run, started, log, report)

    def kill_all(self, why: str) -> None:
        for process, (gpu_run, started, log) in list(self.running.items()):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.record(gpu_run, started, log, {"error": why})
        self.running.clear()


def summary(report: dict) -> str:
    if "error" in report:
        return f"error: {report['error'][:120]}"
    tokens = sum(map(len, report["outputs"]))
    return (
        f"acceptance {report['acceptance']}, {tokens / report['generate_s']:.0f} tok/s, start-up "
        f"{report['startup_s']} s, peak {(report.get('peak_gpu_bytes') or 0) / 2**30:.2f} GiB"
    )


def run_all(out: Path, site: Path, deadline_s: float = DEADLINE_S, rows: int = len(ROWS)) -> None:
    """The first `rows` rows' runs, none started later than LAUNCH_MARGIN_S before deadline_s (a third of a
    short deadline), any still running at deadline_s killed."""
    last_launch = max(deadline_s - LAUNCH_MARGIN_S, deadline_s / 3)
    started = time.monotonic()
    (out / "host.json").write_text(json.dumps(host_line(), indent=2) + "\n")
    with tempfile.TemporaryDirectory(prefix="mtpq-gpu-") as scratch_dir:
        scratch = Path(scratch_dir)
        checkpoint_of = checkpoint_source(scratch)
        engines = Engines(out, site, scratch)
        pending = plan(ROWS[:rows])
        while pending or engines.running:
            elapsed = time.monotonic() - started
            while pending and len(engines.running) < WORKERS and elapsed < last_launch:
                gpu_run = pending.pop(0)
                engines.start(gpu_run, spec_of(gpu_run, checkpoint_of))
            engines.reap()
            if elapsed > last_launch and pending:
                for gpu_run in pending:
                    engines.record(
                        gpu_run, time.monotonic(), Path(os.devnull), {"error": "not started: deadline"}
                    )
                pending.clear()
            if elapsed > deadline_s:
                engines.kill_all(f"killed at the {deadline_s:.0f} s deadline")
            time.sleep(0.5)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)


# --- the dry run (no GPU) ---------------------------------------------------------------------------


class _Kernel:
    """A kernel of vllm._C in the dry run: modules may name it and its overloads as they are imported
    (compilation passes match on them); calling it is a GPU's work."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, overload: str) -> _Kernel:
        return _Kernel(f"{self.name}.{overload}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"vllm._C.{self.name} runs on the GPU only (dry run)")


class _H200Kernels:
    """torch.ops._C for the dry run: the answers an H200 gives to the capability queries vLLM's modules
    make as they are imported, and, once `naming`, every other kernel named. Not while vllm._custom_ops
    is imported: it registers fake implementations for the kernels it finds, which need real ones."""

    ANSWERS = {"cutlass_scaled_mm_supports_fp8": True, "cutlass_scaled_mm_supports_block_fp8": True}

    def __init__(self):
        self.naming = False

    def __getattr__(self, name: str):
        if name in self.ANSWERS:
            return lambda *args, **kwargs: self.ANSWERS[name]
        if not self.naming:
            raise AttributeError(name)
        return _Kernel(name)


def pretend_hopper() -> None:
    """vLLM's own CUDA platform on this CPU machine, answering device queries as an H200 does. Its
    compiled extensions link the GPU driver (libcuda.so.1), which only the host has: the dry run imports
    Python modules, not kernels."""
    import torch

    for extension in ("vllm._C", "vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C"):
        sys.modules.setdefault(extension, types.ModuleType(extension))
    torch.ops._C = kernels = _H200Kernels()
    import vllm._custom_ops  # noqa: F401
    import vllm.platforms

    kernels.naming = True
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class DryRunH200(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(9, 0)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H200 (dry run)"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 141 * 10**9

    vllm.platforms._current_platform = DryRunH200()


# The modules a GPU engine run imports beyond what configuring it does: the probe's entry (`from vllm
# import LLM`, whose pooling entrypoints import FastAPI), the engine and its in-process executor, the
# worker, its attention backends (FlashAttention 3, MLA's FlashMLA and Triton, Gated DeltaNet), fused
# MoE, the MTP proposer, the sampler and structured output.
GPU_MODULES = (
    "vllm.entrypoints.llm",
    "tests.probes.engine_acceptance",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.structured_output",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.mla.flashmla",
    "vllm.v1.attention.backends.mla.triton_mla",
    "vllm.v1.attention.backends.gdn_attn",
    "vllm.v1.spec_decode.eagle",
    "vllm.model_executor.layers.fused_moe.fused_moe",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
    "vllm.compilation.backends",
)


def dry_run(out: Path, site: Path) -> None:
    """Each run configured under its variant's vLLM (dry_run_variant in a process of its own); all the
    configurations in out/dry-run.json."""
    configs = {}
    for variant in dict.fromkeys(gpu_run.run.variant for gpu_run in plan()):
        env = {**os.environ, "PYTHONPATH": pythonpath(variant, site)}
        command = [sys.executable, "-m", "benchmarks.gpu_run", "--dry-run-variant", variant]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"the dry run of the {variant} runs failed (exit {done.returncode})")
        configured = json.loads(done.stdout.strip().splitlines()[-1])
        expected = pythonpath(variant, site).split(os.pathsep)[0]
        if wrong := [
            key for key, config in configured.items() if not config["vllm_file"].startswith(expected)
        ]:
            raise SystemExit(f"the dry run of {wrong[0]} imported vLLM from outside {expected}")
        configs |= configured
    out.mkdir(parents=True, exist_ok=True)
    (out / "dry-run.json").write_text(json.dumps(configs, indent=2) + "\n")


def dry_run_variant(variant: str) -> None:
    """In this process, under the variant's vLLM: each of its runs' checkpoint built and engine config
    created as the host's would be, and the modules its engine imports (its model and draft classes
    among them) imported; a missing one fails here. Prints the configurations as JSON."""
    import importlib

    pretend_hopper()
    import vllm
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.transformers_utils.config import get_config

    from tests.probes.engine_acceptance import engine_arguments
    from tests.probes.mtp_vllm import inspect_in_process

    for module in GPU_MODULES:
        importlib.import_module(module)
    configs = {}
    with tempfile.TemporaryDirectory(prefix="mtpq-gpu-dry-") as scratch:
        checkpoint_of = checkpoint_source(Path(scratch))
        for gpu_run in [gpu_run for gpu_run in plan() if gpu_run.run.variant == variant]:
            spec = spec_of(gpu_run, checkpoint_of)
            model = spec["model"]
            target = get_config(model, trust_remote_code=True)
            draft = get_config(
                model, trust_remote_code=True, hf_overrides_fn=SpeculativeConfig.hf_config_override
            )
            inspect_in_process(*dict.fromkeys([*target.architectures, *draft.architectures]))
            config = EngineArgs(**engine_arguments(spec)).create_engine_config()
            configs[gpu_run.key] = {
                "vllm_file": vllm.__file__,
                "quantization": config.model_config.quantization,
                "speculative": str(config.speculative_config),
                "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
            }
            print(f"configured {gpu_run.key}", file=sys.stderr, flush=True)
    print(json.dumps(configs), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where host.json, runs.jsonl and engines.log go")
    parser.add_argument("--site", type=Path, default=HOST_SITE, help="gpu_kit install's --site")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=bool(os.environ.get("MTPQ_GPU_DRY_RUN")),
        help="no GPU: import and configure every run (also with MTPQ_GPU_DRY_RUN set, as the kit's test "
        "runs the host's own commands)",
    )
    parser.add_argument(
        "--deadline", type=float, default=DEADLINE_S, help="seconds for all runs (%(default)s)"
    )
    parser.add_argument("--rows", type=int, default=len(ROWS), help="run only the first N rows (all)")
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # one engine run's spec (a child process)
    parser.add_argument("--dry-run-variant", help=argparse.SUPPRESS)  # a child process of the dry run
    args = parser.parse_args(argv)
    if args.engine:
        engine(json.loads(args.engine))
    elif args.dry_run_variant:
        dry_run_variant(args.dry_run_variant)
    elif args.dry_run:
        dry_run(args.out, args.site)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        run_all(args.out, args.site, args.deadline, args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
