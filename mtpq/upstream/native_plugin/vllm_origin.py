"""pytest plugin (`-p vllm_origin`): after the session, write where `vllm` was imported from to
$MTPQ_VLLM_ORIGIN_FILE, so that a run on a patched overlay proves it did not test another vLLM."""

import os
import sys


def pytest_sessionfinish(session, exitstatus):
    vllm = sys.modules.get("vllm")
    with open(os.environ["MTPQ_VLLM_ORIGIN_FILE"], "w") as origin:
        origin.write(getattr(vllm, "__file__", None) or "nothing")
