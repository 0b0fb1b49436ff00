"""Scripts run under the patched or the unpatched vLLM in a process of their own (tests/probing.py)."""
