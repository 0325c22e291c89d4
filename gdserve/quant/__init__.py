"""Checkpoints whose linear layers come quantized (AWQ, GPTQ, GGUF) or are quantized at load by
round-to-nearest: each format's tensors become a PackedWeight per projection."""
