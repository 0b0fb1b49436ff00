"""Run greedy generation on the real vLLM engine, several engine runs in one process, and report
MTP acceptance for each.

Usage: python engine_acceptance.py RUNS_JSON
  RUNS_JSON: {"name": {"model": DIR, "speculative_config": {...} or null,
                       "tensor_parallel_size": N (default 1), "in_process": bool (default true),
                       "prompts": [[ids]...] (optional), "max_tokens": N (default 32),
                       "engine_args": {...} (optional, more LLM() arguments),
                       "warmup": bool (default false: generate once untimed first),
                       "time_draft": bool (default false: time every draft-model forward of the
                                     timed generate, with a speculative config)}, ...}

The runs go one after another in this process. In-process runs put the engine core and its worker
in this process too (VLLM_ENABLE_V1_MULTIPROCESSING=0, the uniprocess executor): importing vLLM is
most of an engine's start-up, so this keeps a run to seconds. The others start the usual
multiprocess engine, with tensor-parallel ranks bound to disjoint CPU sets. All runs of one
invocation share tensor_parallel_size and in_process (the choice is made before vLLM is imported).

Prints one JSON object as the last stdout line: {"vllm_file": ..., "runs": {name: report}}, a report
being the generated token ids, speculative-decoding counters from LLM.get_metrics(), timings and,
with a speculative config, what every tensor-parallel rank built its MTP draft with ("draft_ranks"),
or {"error_type", "error"} when the engine failed to start or run: the class name and the
"SomeError: message" line of the exception that failed, in the engine or worker process if there is
one, not the driver's generic "initialization failed". "vllm_file" says which vllm package ran.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack
from itertools import zip_longest

# Before vllm is imported: the CPU KV cache defaults to several GiB.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from tests.checkpoints import default_prompts

_COUNTERS = {
    "num_drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
# "(Worker pid=7) ERROR 11-22 07:33:28 [file.py:870] " in front of log lines.
_LOG_PREFIX = re.compile(r"^((?:\([^)]*\) )?(?:[A-Z]+ [\d-]+ [\d:]+ \[[^\]]*\] )?)")
# A named exception class; the bare "Exception: ..." that vLLM's process
# wrappers raise around a child's failure is deliberately not matched.
_EXCEPTION_START = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): ")
_NOT_A_CONTINUATION = ("Traceback", "  File", "During handling", "The above exception")


def speculative_metrics(metrics) -> dict:
    """Sum the spec-decode counters over engines; acceptance = accepted/drafted."""
    totals = {key: 0 for key in _COUNTERS}
    per_position: list[int] = []
    for metric in metrics:
        for key, name in _COUNTERS.items():
            if metric.name == name:
                totals[key] += metric.value
        if metric.name == _PER_POSITION:
            per_position = [a + b for a, b in zip_longest(per_position, metric.values, fillvalue=0)]
    draft_tokens = totals["draft_tokens"]
    acceptance = totals["accepted_tokens"] / draft_tokens if draft_tokens else None
    return {**totals, "acceptance": acceptance, "per_pos": per_position}


def exception_chain(error: BaseException) -> str:
    messages = []
    while error is not None:
        messages.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return " <- ".join(messages)


def _exception_entries(log: str) -> list[tuple[str, str]]:
    """(log prefix, "SomeError: message") for each exception line of the log, in order.

    A message's continuation lines (same log prefix) are joined onto it.
    """
    lines = []
    for line in log.splitlines():
        prefix = _LOG_PREFIX.match(line).group(1)
        lines.append((prefix, line[len(prefix) :]))
    entries = []
    for index, (prefix, content) in enumerate(lines):
        if not _EXCEPTION_START.match(content):
            continue
        message = [content.strip()]
        for next_prefix, next_content in lines[index + 1 : index + 1 + 5]:
            if (
                next_prefix != prefix
                or not next_content.strip()
                or next_content.startswith(_NOT_A_CONTINUATION)
                or _EXCEPTION_START.match(next_content)
            ):
                break
            message.append(next_content.strip())
        entries.append((prefix, " ".join(message)))
    return entries


def logged_exceptions(log: str) -> list[str]:
    """Distinct "SomeError: message" entries, in order, from the engine log."""
    return list(dict.fromkeys(entry for _, entry in _exception_entries(log)))


def original_exception(failure: BaseException, driver_chain: str, log: str) -> tuple[str, str]:
    """(class name, message) of the exception that made the engine fail.

    Engine-core and worker processes only hand the driver a generic
    "initialization failed"; the root cause exists only in their log, as the
    first exception they log at ERROR level (a traceback prints its root
    cause first).  A failure in the driver itself is its own root cause.
    """
    for prefix, entry in _exception_entries(log):
        if " ERROR " in f" {prefix}" and entry not in driver_chain:
            name, _, message = entry.partition(": ")
            return name.rpartition(".")[2], message
    return type(failure).__name__, str(failure)


def imported_vllm_file() -> str | None:
    """Where the vllm package this run imported lives: patched or unpatched."""
    return getattr(sys.modules.get("vllm"), "__file__", None)


class CapturedOutput:
    """Route fds 1 and 2 of this process and its children into a temp file.

    On exit the capture is copied to stderr, which leaves the JSON report as
    the only line this script writes to stdout.
    """

    def __enter__(self):
        self._log = tempfile.TemporaryFile()
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        for fd in self._saved:
            os.dup2(self._log.fileno(), fd)
        self.text = ""
        return self

    def __exit__(self, *exc_info):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._log.seek(0)
        self.text = self._log.read().decode(errors="replace")
        self._log.close()
        sys.stderr.write(self.text)
        sys.stderr.flush()
        return False


def describe_draft(worker) -> dict:
    """On one worker: its rank, the draft quantization its config resolved, the quant method of each
    of its draft's linears and the shapes of its draft parameters (sharded under tensor parallelism)."""
    import torch.distributed

    from tests.probes.mtp_vllm import describe_linears

    speculative = worker.vllm_config.speculative_config
    decision = getattr(speculative, "draft_quant_decision", None)
    draft = worker.model_runner.drafter.model
    return {
        "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
        "draft_quant_decision": decision if decision is None or isinstance(decision, str) else vars(decision),
        "linears": describe_linears(draft),
        "parameter_shapes": {name: list(param.shape) for name, param in draft.named_parameters()},
        "own_weight_bytes": own_weight_bytes(draft),
    }


def own_weight_bytes(draft) -> int:
    """Bytes of the draft's own parameters: embeddings and LM heads are the target's after loading. The
    CPU backend moves an unquantized linear's weight into a prepacked kernel handle and leaves an empty
    parameter; such a weight counts at its full size in its dtype."""
    from vllm.model_executor.layers.linear import LinearBase

    shared = ("embed_tokens", "lm_head", "shared_head.head")
    total = sum(
        param.numel() * param.element_size()
        for name, param in draft.named_parameters()
        if not any(part in name for part in shared)
    )
    for module in draft.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, LinearBase) and weight is not None and weight.numel() == 0:
            total += module.input_size * module.output_size * module.params_dtype.itemsize
    return total


def time_draft_forwards(worker) -> None:
    """On one worker: record the wall time of every forward of its draft model from now on (one per
    draft step in an eager engine), synchronizing the accelerator around each."""
    import torch

    draft = worker.model_runner.drafter.model
    forward = draft.forward
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    draft.mtpq_forward_s = []

    def timed_forward(*args, **kwargs):
        synchronize()
        started = time.perf_counter()
        output = forward(*args, **kwargs)
        synchronize()
        draft.mtpq_forward_s.append(time.perf_counter() - started)
        return output

    draft.forward = timed_forward


def draft_forward_times(worker) -> list[float]:
    return worker.model_runner.drafter.model.mtpq_forward_s


def in_process_executor():
    """The executor that runs the worker in this process. Passed as a class: vLLM 0.22.1's CPU
    platform replaces the name "uni" with its multiprocess executor."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    return UniProcExecutor


def engine_arguments(spec: dict) -> dict:
    """The LLM() arguments of one run."""
    return {
        "model": spec["model"],
        "trust_remote_code": True,
        "dtype": "bfloat16",
        "max_model_len": 256,
        "max_num_seqs": 8,
        "enforce_eager": True,
        "disable_log_stats": False,
        "speculative_config": spec.get("speculative_config"),
        "tensor_parallel_size": spec.get("tensor_parallel_size", 1),
        **spec.get("engine_args", {}),
    }


def run_one(spec: dict, in_process: bool) -> dict:
    from vllm import LLM, SamplingParams

    from tests.probes.mtp_vllm import inspect_mtp_classes_in_process

    engine_args = engine_arguments(spec)
    inspect_mtp_classes_in_process(spec["model"])
    with ExitStack() as stack:
        if in_process:
            engine_args["distributed_executor_backend"] = in_process_executor()
            stack.enter_context(engine_config_in_force(engine_args))
        started = time.monotonic()
        llm = LLM(**engine_args)
        try:
            startup_s = time.monotonic() - started
            prompts = spec.get("prompts") or default_prompts()
            sampling = SamplingParams(
                temperature=0.0, max_tokens=spec.get("max_tokens", 32), ignore_eos=True, detokenize=False
            )
            requests = [{"prompt_token_ids": prompt} for prompt in prompts]
            if spec.get("warmup"):  # timings: the first generate also pays for one-off warm-up work
                llm.generate(requests, sampling)
            timing_draft = spec.get("time_draft") and spec.get("speculative_config")
            if timing_draft:
                llm.collective_rpc(time_draft_forwards)
            started = time.monotonic()
            results = llm.generate(requests, sampling)
            generate_s = time.monotonic() - started
            report = {
                "outputs": [list(result.outputs[0].token_ids) for result in results],
                **speculative_metrics(llm.get_metrics()),
                "startup_s": round(startup_s, 1),
                "generate_s": round(generate_s, 4),
            }
            if spec.get("speculative_config"):
                report["draft_ranks"] = llm.collective_rpc(describe_draft)
            if timing_draft:
                report["draft_forward_s"] = llm.collective_rpc(draft_forward_times)
            return report
        finally:
            # Now, not when the last reference goes: a reported failure's traceback still holds one.
            llm.llm_engine.engine_core.shutdown()


def engine_config_in_force(engine_args: dict):
    """The engine's config as vLLM's current config for a whole in-process run. vLLM 0.22.1's CPU MoE
    fallback (taken without AVX-512 kernels) builds its activation op at forward time, which needs a
    current config; in a worker process nothing sets one there either, so stock 0.22.1 cannot run an
    MoE model on such a CPU at all ("Current vLLM config is not set")."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    return set_current_vllm_config(EngineArgs(**engine_args).create_engine_config())


def release_engine_state() -> None:
    """What an in-process engine leaves behind, so the next run starts clean (also after a failure)."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()


def run_and_report(spec: dict, in_process: bool) -> dict:
    with CapturedOutput() as captured:
        try:
            return run_one(spec, in_process)
        except Exception as error:  # an engine failure is a result to report
            traceback.print_exc()
            chain = exception_chain(error)
            original = error
        finally:
            if in_process:
                release_engine_state()
    error_type, message = original_exception(original, chain, captured.text)
    return {
        "error_type": error_type,
        "error": f"{error_type}: {message}",
        "driver_error": chain,
        "logged_exceptions": [line for line in logged_exceptions(captured.text) if line not in chain],
    }


def bind_ranks_to_cpus(ranks: int) -> None:
    """vLLM's CPU workers bind their threads per NUMA node, one rank per node; a machine with fewer
    nodes than ranks needs the CPU sets given: split this process's CPUs evenly between the ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // ranks
    if share == 0:
        raise SystemExit(f"{ranks} tensor-parallel ranks need at least {ranks} CPUs, this process has {cpus}")
    groups = [cpus[rank * share : (rank + 1) * share] for rank in range(ranks)]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(",".join(map(str, g)) for g in groups))


def main(argv=None) -> int:
    runs = json.loads((argv or sys.argv[1:])[0])
    kinds = {(spec.get("tensor_parallel_size", 1), spec.get("in_process", True)) for spec in runs.values()}
    if len(kinds) > 1:
        raise SystemExit("runs of one invocation must share tensor_parallel_size and in_process")
    (tensor_parallel_size, in_process) = kinds.pop() if kinds else (1, True)
    if in_process:
        if tensor_parallel_size != 1:
            raise SystemExit("an in-process engine has one rank")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    elif tensor_parallel_size > 1:
        bind_ranks_to_cpus(tensor_parallel_size)
    # describe_draft travels to worker processes as a pickled function.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    reports = {name: run_and_report(spec, in_process) for name, spec in runs.items()}
    print(json.dumps({"vllm_file": imported_vllm_file(), "runs": reports}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
