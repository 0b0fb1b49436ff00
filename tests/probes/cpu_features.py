"""Probe: the CPU-feature branches of vLLM that decide stock outcomes, each taken both ways whatever the CPU
at hand, by standing in for torch's AMX check (which vLLM's CPU platform and MoE kernels ask).

For each checkpoint directory given (argv[1], a JSON list), with AMX said present and absent: the MoE
kernels this vLLM then offers (tests/cpu_features.cpu_moe_kernels), and building the MTP draft as the
proposer does (engine config made as a user's engine makes it; no weights loaded, so no kernel runs):
"built" or the failure. Result: ``{"amx": {"true"|"false": {"moe_kernels": [...], "drafts": {dir: ...}}}}``.
"""

from __future__ import annotations

import json
import sys
from unittest import mock

import torch
import vllm

from tests import cpu_features
from tests.probes.mtp_vllm import build_mtp_draft, failure, init_single_process_distributed


def main() -> None:
    directories = json.loads(sys.argv[1])
    init_single_process_distributed()
    result = {}
    for amx in (False, True):
        with mock.patch.object(torch.cpu, "_is_amx_tile_supported", return_value=amx):
            cpu_features.cpu_moe_kernels.cache_clear()
            drafts = {}
            for directory in directories:
                try:
                    build_mtp_draft(directory)
                    drafts[directory] = "built"
                except Exception as error:  # noqa: BLE001 (a finding to report)
                    drafts[directory] = failure(error)
            result[str(amx).lower()] = {
                "moe_kernels": sorted(cpu_features.cpu_moe_kernels()),
                "drafts": drafts,
            }
    print(json.dumps({"amx": result, "vllm_file": vllm.__file__}))


if __name__ == "__main__":
    main()
