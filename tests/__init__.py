"""The test suite and its helpers, a package imported from the checkout root (pytest's `pythonpath` in
pyproject.toml; the probes' PYTHONPATH, tests/probing.py; `python -m benchmarks.<name>`)."""
