"""Applying the series to vLLM (apply.py, standard library and git only): the series and its pinned
releases, on a vLLM git tree, on an installed vLLM, as a patched wheel, and the rebase matrix."""
