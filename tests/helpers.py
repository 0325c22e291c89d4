"""Shared test helpers: build tiny HF checkpoints, and drive our model through a paged KV cache
the way the ModelRunner does."""
import copy
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerFast

from gdserve.bench.workloads import shared_dir
from gdserve.kernels.kv_cache import to_cache_dtype
from gdserve.kernels.quant import dequant_fp8_rowwise, quant_fp8_rowwise_reference
from gdserve.layers.attention import Attention, AttentionMetadata
from gdserve.models.llama import LlamaForCausalLM

# The team's conformance corpora: beside the repository (or $GDSERVE_SHARED), not in it.
CONFORMANCE = shared_dir() / "conformance"


def require_corpus(path: Path) -> Path:
    """path, or the calling test skipped with a reason naming the missing corpus."""
    if not path.is_dir():
        pytest.skip(f"needs the conformance corpus {path.relative_to(CONFORMANCE)} at {path} "
                    "(set GDSERVE_SHARED to the folder that holds conformance/)")
    return path


# Specials at SmolLM2's ids, then the 256 byte-level tokens: vocab 259.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_LLAMA = dict(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
# The GPU scripts' random GQA Llama: big enough for the Triton kernels' tiles, small enough to load at once.
SMALL_LLAMA = dict(vocab_size=259, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)


def rounded_kv_attention(kv_cache_dtype: torch.dtype) -> str:
    """Register, and name, an HF attention that sees K and V rounded to kv_cache_dtype as an
    fp8 cache stores them: the reference for an engine with that cache."""
    # Imported here: they import triton, which must not load before tests/conftest.py
    # sets TRITON_INTERPRET (this module is imported at collection).
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    name = f"sdpa_kv_{str(kv_cache_dtype).removeprefix('torch.')}"

    def attention(module, query, key, value, *args, **kwargs):
        key, value = (to_cache_dtype(x, kv_cache_dtype).to(x.dtype) for x in (key, value))
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(name, attention)
    return name


def fp8_prefill_attention() -> str:
    """Register, and name, an HF attention computing as fp8_attention=True does over an e4m3
    cache: queries and keys turned by the fixed rotation, the prompt's pass (more than one query)
    in fp8 math, each decode exactly."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from gdserve.kernels.fp8_attention import fp8_attention, rotate, rotation

    name = "sdpa_kv_float8_e4m3fn_fp8_math"

    def attention(module, query, key, value, *args, **kwargs):
        rot = rotation(query.shape[-1]).to(query.device)
        query, key = rotate(query, rot), rotate(key, rot)
        key, value = (to_cache_dtype(x, torch.float8_e4m3fn).to(x.dtype) for x in (key, value))
        num_q, num_k = query.shape[-2], key.shape[-2]
        if num_q == 1:
            return sdpa_attention_forward(module, query, key, value, *args, **kwargs)
        q = query.unflatten(1, (key.shape[1], -1))                       # [B, KVH, G, Q, D]
        positions = torch.arange(num_k, device=query.device)
        mask = positions[None, :] <= positions[num_k - num_q:, None]
        out = fp8_attention(q, key.unsqueeze(2), value.unsqueeze(2), module.scaling, mask)
        return out.flatten(1, 2).to(query.dtype).transpose(1, 2).contiguous(), None

    AttentionInterface.register(name, attention)
    return name


@torch.no_grad()
def fake_quant_fp8_linears(model: torch.nn.Module) -> None:
    """Make an HF model compute as `quantization="fp8"` does (W8A8 dynamic): every linear layer
    but the LM head with its weight rounded to fp8 per output channel and its input per token."""
    head = model.get_output_embeddings()

    def rounded(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return dequant_fp8_rowwise(*quant_fp8_rowwise_reference(rows), x.dtype).view_as(x)

    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            module.weight.copy_(rounded(module.weight))
            module.register_forward_pre_hook(lambda _, args: (rounded(args[0]), *args[1:]))


@torch.no_grad()
def save_random_hf_model(config: PretrainedConfig, path: Path, seed: int = 0):
    """Save an HF model with every weight random, norms and biases included (HF's own init leaves
    norms at 1 and biases at 0, which would hide mix-ups between them). Returns the HF model."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.normal_(1.0, 0.2)
        else:
            param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return model.eval()


def save_byte_tokenizer(path: Path) -> None:
    """A byte-level tokenizer without merges (every byte is a token): any text round-trips,
    eos <|im_end|> = 2, bos <|im_start|> = 1."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                            pad_token="<|im_end|>").save_pretrained(path)


def bind_kv_cache(model: LlamaForCausalLM, num_blocks: int, block_size: int) -> torch.Tensor:
    """Allocate kv [2, layers, num_blocks, block_size, KVH, D] and bind it as the ModelRunner does."""
    cfg = model.config
    weight = model.lm_head.weight
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    kv = torch.zeros(2, len(attns), num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                     dtype=weight.dtype, device=weight.device)
    for i, attn in enumerate(attns):
        attn.k_cache, attn.v_cache = kv[0, i], kv[1, i]
    return kv


def scattered_block_table(num_blocks: int) -> list[int]:
    """Non-contiguous, descending blocks with gaps: 2n-1, ..., 3, 1 (cache needs 2n blocks)."""
    return [2 * i + 1 for i in reversed(range(num_blocks))]


@torch.no_grad()
def run_chunks(model: LlamaForCausalLM, token_ids: list[int], chunk_sizes: list[int],
               block_size: int = 4) -> torch.Tensor:
    """Feed one sequence through a fresh paged cache in chunks (a prefill, later chunks, decodes of
    size 1) over a scattered block table. Returns every token's logits [len(token_ids), V] in the
    LM head's dtype."""
    assert sum(chunk_sizes) == len(token_ids)
    table = scattered_block_table(-(-len(token_ids) // block_size))
    bind_kv_cache(model, 2 * len(table), block_size)
    device = model.lm_head.weight.device
    logits, start = [], 0
    for size in chunk_sizes:
        positions, meta = AttentionMetadata.build([table], [start], [size], block_size, device)
        ids = torch.tensor(token_ids[start:start + size], device=device)
        logits.append(model.compute_logits(model(ids, positions, meta)))
        start += size
    return torch.cat(logits)


def run_prefill_and_decode(model: LlamaForCausalLM, token_ids: list[int], prompt_len: int,
                           block_size: int = 4) -> torch.Tensor:
    """Prefill the first prompt_len tokens in one step, then decode the rest one at a time."""
    return run_chunks(model, token_ids, [prompt_len] + [1] * (len(token_ids) - prompt_len),
                      block_size)


@torch.no_grad()
def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """HF's full-sequence logits [L, V]; causal, so row i is the logits for the prefix [:i + 1]."""
    return hf_model(torch.tensor([token_ids])).logits[0].float()


def chat_ids(llm, text: str) -> dict:
    """A one-turn chat prompt through the model's template, as prompt token ids for LLM.generate."""
    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                     add_generation_prompt=True)
    return {"prompt_token_ids": tok.encode(prompt, add_special_tokens=False)}


# A constraint that takes seconds to compile on any vocabulary: 20,000 enum values, each a terminal
# of the grammar path.
SLOW_SCHEMA = {"type": "object", "required": ["v"],
               "properties": {"v": {"enum": [f"value-{i}-{i * 7919 % 10007}" for i in range(20000)]}}}


@torch.no_grad()
def save_peft_adapter(hf_model, path: Path, r: int = 8, alpha: float = 16,
                      target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                      seed: int = 0, std: float = 0.04, safe_serialization: bool = True, **lora_config_kwargs):
    """Save a PEFT LoRA adapter for (a copy of) hf_model with every lora_A and lora_B random normal
    (peft starts B at zero, which would hide any mix-up). Returns the PeftModel, in eval mode.
    The delta's size goes as std^2 * alpha / sqrt(r): with r=8, alpha=16, std 0.04 turns SmolLM2's
    greedy answers into other coherent ones (0.02 leaves short answers unchanged, 0.05 makes them
    gibberish) and changes the tiny random Llama's within a few tokens."""
    from peft import LoraConfig, get_peft_model  # here: the other helpers do without peft

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0,
                        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
                        **lora_config_kwargs)
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    generator = torch.Generator().manual_seed(seed)
    for name, param in peft_model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    peft_model.save_pretrained(path, safe_serialization=safe_serialization)
    return peft_model.eval()


def save_merged_model(base_dir: Path, adapter_dir: Path, path: Path) -> Path:
    """An HF-format dir (fp32 weights, the base's tokenizer) of base_dir's model with the adapter in
    adapter_dir merged in (peft's merge_and_unload): what the base model serving that adapter should
    compute."""
    from peft import PeftModel

    path.mkdir(parents=True, exist_ok=True)
    for file in Path(base_dir).iterdir():
        weights = file.suffix in (".safetensors", ".bin") or file.name.endswith(".index.json")
        if file.is_file() and not weights and file.name != "config.json":
            shutil.copy(file, path / file.name)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().save_pretrained(path)
    return path
