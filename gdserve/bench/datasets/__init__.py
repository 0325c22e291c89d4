"""The datasets of `gdserve bench throughput --dataset-name ...` (vLLM's `bench throughput`):
random token ids, ShareGPT conversations, and a JSONL of prompts, each sampled into
SampleRequests."""
