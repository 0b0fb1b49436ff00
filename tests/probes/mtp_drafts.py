"""Probe: MTP drafts built and loaded the way the engine does, every section in one process.

Run under an unpatched or a patched vLLM (patched ``vllm`` first on PYTHONPATH). Importing vLLM is
most of a probe's cost, so the construction and weight-loading sections share one process per vLLM
variant; each section is a module of this directory with a ``probe() -> dict``:

* ``drafter_matrix``: drafter_matrix, every MTP drafter of the registry under a quantized target
* ``construction``: mtp_draft_construction, the quant method of every linear per checkpoint layout
* ``dsv4_ignore_entries``: dsv4_mtp_ignore_entries, DeepSeek-V4 MTP ignore entries and the draft
* ``dsv4``: dsv4_bf16_mtp, DeepSeek-V4 drafts built, loaded and their o_proj run
* ``step3p5``: step3p5_mtp, Step-3.5 NVFP4 and INT8 drafts built and loaded
* ``families``: mtp_families, Qwen3.5 / GLM-4.x / GLM-5 drafts of BF16 MTP layers under each format

Arguments name the sections to run (all by default). Last stdout line: one JSON object,
``{"vllm_file": ..., section: result, ...}``.
"""

from __future__ import annotations

import importlib
import json
import sys

# drafter_matrix first: it builds DeepSeek-V4 as the CPU platform resolves it, before the dsv4 sections
# register the NVIDIA classes under its architecture names.
SECTIONS = {
    "drafter_matrix": "drafter_matrix",
    "construction": "mtp_draft_construction",
    "dsv4_ignore_entries": "dsv4_mtp_ignore_entries",
    "dsv4": "dsv4_bf16_mtp",
    "step3p5": "step3p5_mtp",
    "families": "mtp_families",
}


def main(sections: list[str]) -> None:
    import vllm

    from tests.probes.mtp_vllm import init_single_process_distributed

    init_single_process_distributed()
    result = {"vllm_file": vllm.__file__}
    for section in sections or SECTIONS:
        result[section] = importlib.import_module(f"tests.probes.{SECTIONS[section]}").probe()
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
