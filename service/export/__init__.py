"""Export stage: confirmed failures become offline eval tasks (native JSONL, Inspect AI, verifiers)."""
