"""Figures, not assertions: each is run from the checkout root as `python -m benchmarks.<name>`."""
