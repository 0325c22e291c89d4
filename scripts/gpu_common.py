"""The GPU scripts' shared set-up, imported by scripts/gpu_checks.py (`make test-gpu`) and the other
scripts/*_gpu.py after they put scripts/ on sys.path:
- setup_imports: gdserve importable from the checkout without installing it, and the wheels carried
  in build/gpu-wheels (`make gpu-carry`) installed into a temp dir;
- timers: median_ms (CUDA events), graph_time_us (CUDA graph replays), copy_bandwidth_gbs, and
  sweep_tiles over a kernel's tile configs; decode_case (a paged decode attention batch);
- random-weight model dirs: LLAMA3_8B (the shape), save_model_dir (config.json and a tokenizer for
  load_format="dummy"); tokenizers: tokenizer_arg (--tokenizer=), save_byte_pair_tokenizer;
- for comparisons of the engine's output against HF's or another run's: make_prompts (ragged random
  prompts) and first_logprob.

Runs under the device image's python3 and imports nothing of the server (no fastapi, uvicorn,
pydantic, gguf, prometheus_client); torch, transformers and gdserve are imported inside the
functions that need them.
"""
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "build" / "gpu-wheels"


def setup_imports() -> None:
    """gdserve importable from the checkout with its package dirs mapped as pyproject maps them
    (a temp tree of symlinks, so spawned compile workers import it too); carried wheels
    (outlines-core) installed into a temp dir."""
    import importlib
    pkg = Path(tempfile.mkdtemp(prefix="gdserve-src-")) / "gdserve"
    pkg.mkdir()
    for entry in (ROOT / "gdserve").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name in ("grammar", "kernels", "schemas"):  # pyproject's package-dir
        (pkg / name).symlink_to(ROOT / name)
    sys.path.insert(0, str(pkg.parent))
    # A wheel's name starts with its module's name (outlines_core-0.2.14-...): install the missing.
    missing = [w for w in WHEELS.glob("*.whl") if importlib.util.find_spec(w.name.split("-")[0]) is None]
    if missing:
        site = Path(tempfile.gettempdir()) / "gdserve-site"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--upgrade", "--target", str(site), *map(str, missing)], check=True)
        sys.path.insert(1, str(site))
    importlib.import_module("gdserve.grammar")


# ---- timers, kernel cases ---------------------------------------------------------------------
def median_ms(fn, reps: int = 50) -> float:
    """Median over reps of CUDA-event-timed calls, after a warm-up."""
    import torch
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graph_time_us(fn, reps: int = 20, rounds: int = 5) -> float:
    """Median microseconds of one call of fn, over rounds of reps calls replayed from a CUDA graph:
    the device's time alone, as the engine's graphs run it (median_ms also counts each launch's
    host time where the device waits for it)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    return sorted(ts)[len(ts) // 2]


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 4 GiB: bytes read plus bytes written over the time."""
    import torch
    src = torch.randn(1 << 30, device="cuda")  # 4 GiB of float32
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=20)
    del src, dst
    return 2 * (4 << 30) / ms / 1e6


def decode_case(batch: int, context: int, num_heads: int = 32, num_kv_heads: int = 8, head_dim: int = 128,
                block_size: int = 16, kv_dtype=None):
    """Random bf16 queries and caches (kv_dtype: the caches' type, bf16 if None); each sequence's
    blocks scattered over the cache."""
    import torch
    blocks_per_seq = context // block_size
    num_blocks = batch * blocks_per_seq + 7
    gen = torch.Generator(device="cuda").manual_seed(0)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device="cuda", generator=gen,
                          dtype=torch.bfloat16).to(kv_dtype or torch.bfloat16)
    v_cache = torch.randn(k_cache.shape, device="cuda", generator=gen, dtype=torch.bfloat16).to(k_cache.dtype)
    tables = torch.randperm(num_blocks, device="cuda", generator=gen)[:batch * blocks_per_seq]
    tables = tables.view(batch, blocks_per_seq).to(torch.int32)
    q = torch.randn(batch, num_heads, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * k_cache.element_size()
    return q, k_cache, v_cache, tables, lens, kv_bytes


def sweep_tiles(kernel, ref, kv_bytes: int, block_ns, warps, stages, timer=median_ms) -> list[dict]:
    """Time kernel(**tile) with timer for each tile of the grid, with its error against ref; a tile
    that does not compile (shared memory, layouts) is left out with its error printed."""
    rows = []
    for block_n in block_ns:
        for num_warps in warps:
            for num_stages in stages:
                cfg = dict(block_n=block_n, num_warps=num_warps, num_stages=num_stages)
                run = lambda: kernel(**cfg)
                try:
                    err = (run().float() - ref.float()).abs().max().item()
                    ms = timer(run)
                except Exception as e:
                    print(json.dumps({**cfg, "error": repr(e)[:200]}), flush=True)
                    continue
                rows.append({**cfg, "ms": round(ms, 4), "gbs": round(kv_bytes / ms / 1e6, 1), "max_abs_err": err})
    return rows


# ---- random-weight models, tokenizers, prompts ------------------------------------------------
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, vocab_size=49152,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, architectures=["LlamaForCausalLM"])


TOKENIZER = ROOT / "build" / "tokenizer"  # the default model's tokenizer files (`make gpu-carry`)


def save_model_dir(path: Path, num_layers: int, tokenizer: Path | None = None,
                   vocab_size: int = LLAMA3_8B["vocab_size"]) -> None:
    """config.json (Llama-3-8B shape, fewer layers) and a tokenizer spanning the vocab (the engine
    decodes every id it samples): the files in `tokenizer` (a saved tokenizer of that vocab size,
    SmolLM2's from `make gpu-carry`), else a synthetic byte-level one of 1- to 3-byte tokens."""
    from transformers import AutoTokenizer, LlamaConfig
    LlamaConfig(**{**LLAMA3_8B, "vocab_size": vocab_size}, num_hidden_layers=num_layers).save_pretrained(path)
    if tokenizer is None:
        save_byte_pair_tokenizer(path, vocab_size)
        return
    saved = AutoTokenizer.from_pretrained(tokenizer)
    if len(saved) != vocab_size:
        raise SystemExit(f"{tokenizer}: {len(saved)} tokens, the model's vocab is {vocab_size}")
    saved.save_pretrained(path)


def tokenizer_arg(argv: list[str]) -> Path | None:
    """--tokenizer=DIR (a saved tokenizer), --tokenizer=byte-pair (the synthetic one); default
    build/tokenizer, which `make gpu-carry` saves."""
    value = next((a.split("=", 1)[1] for a in argv if a.startswith("--tokenizer=")), str(TOKENIZER))
    if value == "byte-pair":
        return None
    if not (Path(value) / "tokenizer_config.json").is_file():
        raise SystemExit(f"no saved tokenizer in {value}: run `make gpu-carry` here and carry build/tokenizer, "
                         "or pass --tokenizer=byte-pair")
    return Path(value)


def save_byte_pair_tokenizer(path: Path, vocab_size: int = LLAMA3_8B["vocab_size"]) -> None:
    """Byte-level BPE over the 256 bytes, then byte pairs, then byte triples, up to the vocab
    size (no merges)."""
    import itertools
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    longer = itertools.chain(map("".join, itertools.product(alphabet, repeat=2)),
                             map("".join, itertools.product(alphabet, repeat=3)))
    tokens = specials + alphabet + list(itertools.islice(longer, vocab_size - len(specials) - len(alphabet)))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                            pad_token="<|im_end|>").save_pretrained(path)


def make_prompts(n: int = 16, vocab: int = 49152) -> list[list[int]]:
    """Ragged random prompts; every fourth shares a 64-token prefix with the one before (prefix hits)."""
    rng = random.Random(0)
    prompts = []
    for i in range(n):
        if i % 4 == 3:
            prompts.append(prompts[-1][:64] + [rng.randrange(3, vocab) for _ in range(rng.randint(5, 100))])
        else:
            prompts.append([rng.randrange(3, vocab) for _ in range(rng.randint(17, 400))])
    return prompts


def first_logprob(completion) -> float:
    """The logprob our engine gave its own first token."""
    entry = completion.logprobs[0]
    lp = entry[completion.token_ids[0]] if isinstance(entry, dict) else entry
    return float(getattr(lp, "logprob", lp))
