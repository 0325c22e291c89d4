"""How far fp8 attention math (`fp8_attention=True`) moves a trained model: the default model on
the CPU (which runs the same math as the GPU kernels, kernels/fp8_attention.py), prompts cut from
the repository's own docs at several lengths.

1. Attention itself: each layer's prefill attention output on the model's real queries, keys and
   values against exact attention over unrounded K and V (relative error per row): an e4m3 cache
   with exact math, fp8 math over it, and fp8 math over queries and keys turned by the rotation
   first (what fp8_attention does).
2. The model: greedy outputs, and the log-probability of the baseline's first token (the one
   the prompt's prefill decides), with a bf16 cache, an fp8 cache, and an fp8 cache with fp8
   attention math.

    python scripts/fp8_attention_accuracy.py [--lengths 256,512,1024,1536] [--per-length 8]
        [--max-tokens 32] [--output FILE]
"""
import argparse
import json
from pathlib import Path

import torch

from gdserve import LLM, SamplingParams
from gdserve.kernels.fp8_attention import fp8_attention, rotate, rotation
from gdserve.layers.attention import Attention
from gdserve.models.loader import load_tokenizer, resolve_model
from gdserve.models.registry import DEFAULT_MODEL

REPO = Path(__file__).resolve().parents[1]
RUNS = {"bf16 cache": {}, "fp8 cache": {"kv_cache_dtype": "fp8"},
        "fp8 cache + fp8_attention": {"kv_cache_dtype": "fp8", "fp8_attention": True}}


def doc_prompts(model: str, lengths: list[int], per_length: int) -> list[list[int]]:
    """per_length windows of each length, spread over the docs' tokens."""
    text = "\n\n".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    ids = load_tokenizer(resolve_model(model)).encode(text)
    prompts = []
    for length in lengths:
        stride = max(1, (len(ids) - length) // per_length)
        prompts += [ids[i * stride:i * stride + length] for i in range(per_length)]
    return prompts


def _attention(q, k, v, scale, fp8_math: bool, rot: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of one whole prompt, q/k/v: [heads, L, D] float32: over K and V rounded to
    e4m3 as the cache stores them (None: not rounded), in fp8 math or exactly, with the queries
    and keys turned by rot first."""
    if rot is not None:
        q, k = rotate(q, rot), rotate(k, rot)
    k, v = (x.to(torch.float8_e4m3fn).float() for x in (k, v))
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if fp8_math:
        return fp8_attention(q, k, v, scale, mask)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def _summary(rel: torch.Tensor) -> dict:
    return {"rows": rel.numel(), "median": rel.median().item(), "mean": rel.mean().item(),
            "p99": rel.sort().values[int(0.99 * (rel.numel() - 1))].item(), "max": rel.max().item()}


def attention_errors(llm: LLM, prompts: list[list[int]]) -> dict:
    """Each prompt's prefill attention (one chunk: the whole prompt), per layer, on the model's
    queries, keys and values (hooked on an engine with a cache in the model's dtype), against
    exact attention over unrounded K and V: an e4m3 cache with exact math, fp8 math over it, and
    fp8 math with the rotation (what fp8_attention does); the error per output row over its norm."""
    variants = {"e4m3 cache, exact math": dict(fp8_math=False),
                "fp8 math, no rotation": dict(fp8_math=True),
                "fp8 math, rotated (fp8_attention)": dict(fp8_math=True, rotate=True)}
    errors = {name: [] for name in variants}

    def compare(module, args, out):
        q, k, v, meta = args
        if meta.num_decodes == len(meta.query_lens):
            return
        assert meta.num_decodes == 0 and meta.query_lens == meta.seq_lens, "one whole prompt a chunk"
        group = q.shape[1] // k.shape[1]
        q, k, v = (x.float().repeat_interleave(h, 1).transpose(0, 1) for x, h in ((q, 1), (k, group), (v, group)))
        s = (q @ k.transpose(-1, -2) * module.scale).masked_fill(
            ~torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).tril(), float("-inf"))
        exact = torch.softmax(s, -1) @ v
        rot = rotation(q.shape[-1])
        for name, how in variants.items():
            approx = _attention(q, k, v, module.scale, how["fp8_math"], rot if how.get("rotate") else None)
            errors[name].append(((approx - exact).norm(dim=-1) / exact.norm(dim=-1).clamp_min(1e-12)).flatten())

    hooks = [m.register_forward_hook(compare) for m in llm.engine.model.modules() if isinstance(m, Attention)]
    try:
        for ids in prompts:  # one at a time: each prefill one whole chunk
            llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0))
    finally:
        for h in hooks:
            h.remove()
    return {name: _summary(torch.cat(rel)) for name, rel in errors.items()}


def generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=20)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)]


def compare(base: list, other: list) -> dict:
    """Greedy tokens and the first token's log-probabilities against a baseline run."""
    same, first_diff, top1, dlogp = 0, [], 0, []
    for b, o in zip(base, other):
        diff = next((i for i, (x, y) in enumerate(zip(b.token_ids, o.token_ids)) if x != y), None)
        same += diff is None
        first_diff.append(len(b.token_ids) if diff is None else diff)
        top1 += b.token_ids[0] == o.token_ids[0]
        token = b.token_ids[0]  # the baseline's choice, in the other run's top 20 (else past its 20th)
        other_logprob = o.logprobs[0].get(token, min(o.logprobs[0].values()))
        dlogp.append(abs(b.logprobs[0][token] - other_logprob))
    n = len(base)
    return {"same_output": f"{same}/{n}", "mean_tokens_before_first_difference": sum(first_diff) / n,
            "first_token_same": f"{top1}/{n}", "first_token_logprob_diff_mean": sum(dlogp) / n,
            "first_token_logprob_diff_max": max(dlogp)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--lengths", default="256,512,1024,1536")
    p.add_argument("--per-length", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--output")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    prompts = doc_prompts(args.model, lengths, args.per_length)
    result = {"args": vars(args), "attention": {}, "model": {}}
    outputs = {}
    for name, kwargs in RUNS.items():
        # no prefix cache: the windows of different lengths share their starts, and each
        # prompt's attention is measured over one whole-prompt chunk
        llm = LLM(args.model, max_model_len=max(lengths) + args.max_tokens, enable_prefix_caching=False,
                  max_num_batched_tokens=max(2048, max(lengths)), **kwargs)
        if name == "bf16 cache":
            for length in lengths:
                window = [ids for ids in prompts if len(ids) == length]
                result["attention"][length] = attention_errors(llm, window)
                print(json.dumps({"attention, prompt length": length, **result["attention"][length]}), flush=True)
        outputs[name] = generate(llm, prompts, args.max_tokens)
        llm.engine.close()
    for name in ("fp8 cache", "fp8 cache + fp8_attention"):
        result["model"][f"{name} vs bf16 cache"] = compare(outputs["bf16 cache"], outputs[name])
    result["model"]["fp8 cache + fp8_attention vs fp8 cache"] = compare(outputs["fp8 cache"],
                                                                   outputs["fp8 cache + fp8_attention"])
    for name, row in result["model"].items():
        print(json.dumps({"model": name, **row}), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
