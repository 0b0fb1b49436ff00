"""mtpq: a patch series that makes MTP speculative decoding work on quantized checkpoints."""
