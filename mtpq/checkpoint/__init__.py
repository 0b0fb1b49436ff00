"""The checkpoint tools, `mtpq doctor` and `mtpq graft` (standard library only; huggingface_hub for the
Hub): a checkpoint's config files and safetensors headers, the series' MTP survey of them, what each
vLLM release does with them (facts), the doctor's verdicts and report, and the graft."""
