"""Probe: what vLLM's SpeculativeConfig makes of checkpoints and --speculative-configs.

Usage: python speculative_config.py SCENARIOS_JSON
  SCENARIOS_JSON: {"name": [MODEL_DIR, SPECULATIVE_CONFIG], ...}

Builds the real ModelConfig and SpeculativeConfig the engine would build (no
model weights are read, no engine starts) under whichever vLLM is first on
PYTHONPATH, once per scenario in one process (importing vLLM is the slow part).
Last stdout line: {"vllm_file": ..., "verdicts": {name: verdict}}, a verdict
being the resolved draft quantization ("unquantized", "target", or the v0.22.1 series'
"target/unquantized" split), the config hash and the INFO lines vLLM logged about it,
or ``{"error_type": ..., "error": ...}`` when refused.
"""

import json
import logging
import sys

import vllm
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

SPECULATIVE_LOGGER = "vllm.config.speculative"


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def decision_name(decision) -> str | None:
    """ "unquantized" / "target" (the v0.33.0 series stores that string; the v0.22.1 series an object
    deciding MTP layer and decoder block apart, shown as "target/unquantized" when they differ)."""
    if decision is None or isinstance(decision, str):
        return decision
    if decision.mtp_layer == decision.block:
        return decision.mtp_layer
    return f"{decision.mtp_layer}/{decision.block}"


def resolve(model_dir: str, speculative_config: dict) -> dict:
    verdict: dict = {}
    logs = _Collect()
    # On the module's own logger, at INFO: vLLM configures the "vllm" logger (level, handlers) lazily.
    logger = logging.getLogger(SPECULATIVE_LOGGER)
    logger.setLevel(logging.INFO)
    logger.addHandler(logs)
    try:
        target = ModelConfig(model=model_dir, trust_remote_code=True, max_model_len=256)
        speculative = SpeculativeConfig(
            target_model_config=target,
            target_parallel_config=ParallelConfig(),
            **speculative_config,
        )
    except Exception as error:  # the verdict, not a crash: tests assert on it
        verdict.update(error_type=type(error).__name__, error=str(error))
    else:
        verdict.update(
            method=speculative.method,
            decision=decision_name(getattr(speculative, "draft_quant_decision", None)),
            hash=speculative.compute_hash(),
        )
    finally:
        logger.removeHandler(logs)
    verdict["log"] = [line for line in logs.lines if "draft" in line.lower()]
    return verdict


def main() -> None:
    scenarios = json.loads(sys.argv[1])
    verdicts = {name: resolve(*scenario) for name, scenario in scenarios.items()}
    print(json.dumps({"vllm_file": vllm.__file__, "verdicts": verdicts}))


if __name__ == "__main__":
    main()
