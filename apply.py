#!/usr/bin/env python3
"""Apply the mtpq patch series to vLLM: see `python apply.py --help` and README.md."""

import sys

from mtpq.cli import main

if __name__ == "__main__":
    sys.exit(main())
