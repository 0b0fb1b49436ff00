"""mtpq: a patch series that makes MTP speculative decoding work on quantized checkpoints.

By concern: apply/ applies the series to vLLM (apply.py), checkpoint/ holds the checkpoint tools
(doctor, graft), upstream/ the upstream tools; each imports core/, what they share, and never another.
mtpq_command.py is the `mtpq` command line over the last two, output.py what both command lines write
(stdout a reader may close, notes and progress on stderr). VLLM_VERSIONS and patches/ link to the
checkout's own (core/package_data.py).
"""

__version__ = "0.21.0"  # pyproject.toml reads it
