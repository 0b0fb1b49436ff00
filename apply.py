#!/usr/bin/env python3
"""Apply the mtpq patch series to vLLM: see `python apply.py --help` and README.md."""

import sys

if sys.version_info < (3, 10):  # noqa: UP036 (the check is for the Pythons ruff's target excludes)
    sys.exit("error: apply.py needs Python 3.10 or newer; this is " + sys.version.split()[0])

from mtpq.apply.apply_command import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
