"""`python -m mtpq doctor|graft`: the checkpoint tools (Python only: no torch, no vLLM)."""

import sys

from mtpq.checkpoint_cli import main

sys.exit(main())
