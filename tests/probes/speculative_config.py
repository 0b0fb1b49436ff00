"""Probe: what vLLM's SpeculativeConfig makes of checkpoints and --speculative-configs.

Usage: python speculative_config.py SCENARIOS_JSON
  SCENARIOS_JSON: {"name": [MODEL_DIR, SPECULATIVE_CONFIG], ...}

Builds the real ModelConfig and SpeculativeConfig the engine would build (no
model weights are read, no engine starts) under whichever vLLM is first on
PYTHONPATH, once per scenario in one process (importing vLLM is the slow part).
Last stdout line: {"vllm_file": ..., "verdicts": {name: verdict}}, a verdict
being the resolved draft quantization, the config hash and the INFO lines vLLM
logged about it, or ``{"error_type": ..., "error": ...}`` when refused.
"""

import json
import logging
import sys

import vllm
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def resolve(model_dir: str, speculative_config: dict) -> dict:
    verdict: dict = {}
    logs = _Collect()
    logging.getLogger("vllm").addHandler(logs)
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
        decision = getattr(speculative, "draft_quant_decision", None)
        verdict.update(
            method=speculative.method,
            decision=decision and {"mtp_layer": decision.mtp_layer, "block": decision.block},
            hash=speculative.compute_hash(),
        )
    finally:
        logging.getLogger("vllm").removeHandler(logs)
    verdict["log"] = [line for line in logs.lines if "draft" in line.lower()]
    return verdict


def main() -> None:
    scenarios = json.loads(sys.argv[1])
    verdicts = {name: resolve(*scenario) for name, scenario in scenarios.items()}
    print(json.dumps({"vllm_file": vllm.__file__, "verdicts": verdicts}))


if __name__ == "__main__":
    main()
