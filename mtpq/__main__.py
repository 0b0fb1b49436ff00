"""`python -m mtpq doctor|graft|upstream`: the checkpoint tools and the upstream tools (Python only:
no torch, no vLLM; `upstream prove` runs the tests in an interpreter that has them)."""

import sys

from mtpq.mtpq_command import main

sys.exit(main(prog="python -m mtpq"))
