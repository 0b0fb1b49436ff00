"""Run greedy generation on the real vLLM engine and report MTP acceptance.

Usage: python engine_acceptance.py MODEL_DIR [--speculative-config JSON]
       [--prompts JSON] [--max-tokens N] [--load-format dummy]

Prints one JSON object as the last stdout line: the generated token ids,
speculative-decoding counters from LLM.get_metrics() and timings, or
{"error_type", "error"} when the engine fails to start or run: the class
name and the "SomeError: message" line of the exception that failed in the
engine or worker process, not the driver's generic "initialization failed".
Either way "vllm_file" says which vllm package ran.  Leave out
--speculative-config for a run without MTP.  One engine per process: the CPU
platform spawns workers, so a fresh process is the only clean way to change
the configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import traceback
from itertools import zip_longest
from pathlib import Path

# Before vllm is imported: the CPU KV cache defaults to several GiB.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from checkpoints import default_prompts  # noqa: E402

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


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="checkpoint directory")
    parser.add_argument(
        "--speculative-config",
        type=json.loads,
        default=None,
        help='e.g. \'{"method": "mtp", "num_speculative_tokens": 2}\'',
    )
    parser.add_argument("--prompts", type=json.loads, default=default_prompts())
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--load-format",
        default="auto",
        help='"dummy" (random weights) checks that an architecture starts at all',
    )
    return parser.parse_args(argv)


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


def run(args) -> dict:
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(
        model=args.model,
        trust_remote_code=True,
        dtype="bfloat16",
        max_model_len=256,
        max_num_seqs=8,
        enforce_eager=True,
        disable_log_stats=False,
        speculative_config=args.speculative_config,
        load_format=args.load_format,
    )
    startup_s = time.monotonic() - started

    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)
    started = time.monotonic()
    results = llm.generate([{"prompt_token_ids": prompt} for prompt in args.prompts], sampling)
    generate_s = time.monotonic() - started
    return {
        "outputs": [list(result.outputs[0].token_ids) for result in results],
        **speculative_metrics(llm.get_metrics()),
        "startup_s": round(startup_s, 1),
        "generate_s": round(generate_s, 1),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    failure = None
    with CapturedOutput() as captured:
        try:
            report = run(args)
        except Exception as error:  # an engine failure is a result to report
            traceback.print_exc()
            failure = error
    if failure is not None:
        chain = exception_chain(failure)
        error_type, error = original_exception(failure, chain, captured.text)
        report = {
            "error_type": error_type,
            "error": f"{error_type}: {error}",
            "driver_error": chain,
            "logged_exceptions": [line for line in logged_exceptions(captured.text) if line not in chain],
        }
    report["vllm_file"] = imported_vllm_file()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
