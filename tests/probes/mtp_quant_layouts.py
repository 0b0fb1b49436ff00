"""Probe: build and load the MTP draft of each checkpoint directory given, as the engine does.

Run under an unpatched or a patched vLLM (patched ``vllm`` first on PYTHONPATH), with the checkpoint
directories as arguments. Last stdout line: one JSON object, ``{"vllm_file": ..., "drafts": {directory:
mtp_vllm.build_and_load's result}}``: the quant method of every built module, and whether loading
succeeded or the error it raised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(checkpoint_dirs: list[str]) -> None:
    import vllm

    from tests.probes.mtp_vllm import build_and_load, init_single_process_distributed

    init_single_process_distributed()
    drafts = {directory: build_and_load(Path(directory)) for directory in checkpoint_dirs}
    sys.stdout.flush()
    print(json.dumps({"vllm_file": vllm.__file__, "drafts": drafts}, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
