"""The standard benchmark workloads, defined here so that a clone runs its benches on its own.

random_workload: n requests, prompt lengths uniform in [128, 1024], output lengths uniform in
[64, 512], random token ids (ids 1000.. so no special tokens), each request run to its own
max_tokens (EOS ignored); deterministic for a seed. cpu_workload: the same shape scaled for a 2-core
CPU. guided_workload: every request constrained by a JSON Schema of guided_schemas.json.

They are the team's reference definitions, request for request (tests/bench/test_workloads.py holds
them to it where that reference is present). `$GDSERVE_SHARED` (default: `shared/` beside the
repository) names where the optional corpora live: conformance/maskbench-dev and the
JSON-Schema-Test-Suite, which `bench maskbench` and the conformance tests read.
"""
import json
import os
import random
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDED_SCHEMAS = Path(__file__).with_name("guided_schemas.json")

# Llama-3-8B dimensions (the vocabulary taken from the tokenizer in use), for random-weight GPU runs.
LLAMA3_8B_SHAPE = dict(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
)


def random_workload(n: int = 256, vocab: int = 49152, seed: int = 0, prompt_len: tuple[int, int] = (128, 1024),
                    output_len: tuple[int, int] = (64, 512)) -> list[dict]:
    """[{"id", "prompt_ids", "max_tokens"}]: lengths uniform in the ranges, ids in [1000, vocab)."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        p = rng.randint(*prompt_len)
        o = rng.randint(*output_len)
        requests.append({"id": i, "prompt_ids": [rng.randrange(1000, vocab) for _ in range(p)], "max_tokens": o})
    return requests


def cpu_workload(n: int = 64, vocab: int = 49152, seed: int = 0) -> list[dict]:
    """The CPU-sized variant (2 cores, SmolLM2-135M): shorter prompts and outputs."""
    return random_workload(n=n, vocab=vocab, seed=seed, prompt_len=(32, 256), output_len=(16, 128))


def guided_workload(n: int = 256, vocab: int = 49152, seed: int = 0, prompt_len: tuple[int, int] = (128, 1024),
                    max_tokens: int = 512) -> list[dict]:
    """Every request JSON-Schema constrained ("json_schema": schema id % 8 of guided_schemas.json);
    an output ends when its JSON is complete, or at max_tokens."""
    schemas = json.loads(GUIDED_SCHEMAS.read_text())
    requests = random_workload(n=n, vocab=vocab, seed=seed, prompt_len=prompt_len,
                               output_len=(max_tokens, max_tokens))
    for r in requests:
        r["json_schema"] = schemas[r["id"] % len(schemas)]
    return requests


def shared_dir() -> Path:
    """`$GDSERVE_SHARED`, else the `shared/` folder beside the repository (the optional corpora)."""
    return Path(os.environ.get("GDSERVE_SHARED", REPO_ROOT.parent / "shared"))
