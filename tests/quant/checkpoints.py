"""Quantized checkpoints made here, by round-to-nearest quantization of a tiny random Llama into
each format's own layout (packing written out from the formats' documentation, not with gdserve's
code), each beside an HF-format twin holding the dequantized weights."""
import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.torch import save_file
from transformers import LlamaConfig

from tests.helpers import TINY_LLAMA, save_byte_tokenizer, save_random_hf_model

# hidden 128, intermediate 256: groups of 64 and 128 divide every in_features
QUANT_LLAMA = {**TINY_LLAMA, "hidden_size": 128, "intermediate_size": 256}
SAME_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# AutoAWQ GEMM: 8 output columns per int32; nibble i (bits 4i..4i+3) holds column AWQ_ORDER[i].
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def rtn(weight: torch.Tensor, bits: int, group_size: int, sym: bool):
    """weight [K, N] -> q [K, N], scales [K / G, N] fp16, zeros [K / G, N] with W ~ (q - zero) * scale."""
    k, n = weight.shape
    groups = weight.view(k // group_size, group_size, n)
    maxq = 2 ** bits - 1
    if sym:
        scales = (groups.abs().amax(dim=1) * 2 / maxq).half()
        zeros = torch.full_like(scales, (maxq + 1) // 2, dtype=torch.int32)
    else:
        low, high = groups.amin(dim=1), groups.amax(dim=1)
        scales = ((high - low) / maxq).half()
        zeros = (-low / scales.float()).round().clamp(0, maxq).int()
    q = (groups / scales.float()[:, None] + zeros[:, None]).round().clamp(0, maxq).int().view(k, n)
    return q, scales, zeros


def dequant(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_of_row: torch.Tensor) -> torch.Tensor:
    return (q - zeros[group_of_row]) * scales.float()[group_of_row]


def awq_pack(q: torch.Tensor) -> torch.Tensor:
    """[R, C] nibbles -> int32 [R, C / 8], AWQ's order."""
    words = torch.zeros(q.shape[0], q.shape[1] // 8, dtype=torch.int64)
    for nibble, column in enumerate(AWQ_ORDER):
        words |= q[:, column::8].long() << (4 * nibble)
    return (words - (words >= 2 ** 31) * 2 ** 32).to(torch.int32)


def pack_plain(q: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """GPTQ: element i of `dim` in word i // (32 / bits), at bit (i % (32 / bits)) * bits."""
    per_word = 32 // bits
    q = q.long().movedim(dim, 0)
    words = torch.zeros(q.shape[0] // per_word, *q.shape[1:], dtype=torch.int64)
    for i in range(per_word):
        words |= q[i::per_word] << (bits * i)
    words = words - (words >= 2 ** 31) * 2 ** 32
    return words.to(torch.int32).movedim(0, dim).contiguous()


def _quantized_linears(hf_model, fmt: str, bits: int, group_size: int, sym: bool, desc_act: bool,
                       zero_offset: int, seed: int):
    """Per linear layer (LM head apart): the checkpoint tensors and the dequantized weight [N, K]."""
    generator, orders = torch.Generator().manual_seed(seed), {}
    for name, module in hf_model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head":
            continue
        weight = module.weight.detach().t().contiguous()                    # [K, N]
        k = weight.shape[0]
        # desc_act: groups are formed over the rows in a shuffled order (GPTQ's, from the input's
        # statistics: the same for projections of one input); row k is in group g_idx[k]
        parent, _, proj = name.rpartition(".")
        key = (parent, SAME_INPUT.get(proj, proj))
        if key not in orders:
            orders[key] = torch.randperm(k, generator=generator) if desc_act else torch.arange(k)
        order = orders[key]
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = torch.arange(k, dtype=torch.int32) // group_size
        q_sorted, scales, zeros = rtn(weight[order], bits, group_size, sym)
        q = torch.empty_like(q_sorted)
        q[order] = q_sorted
        dense = dequant(q, scales, zeros, g_idx.long()).t()
        if fmt == "awq":
            tensors = {"qweight": awq_pack(q), "qzeros": awq_pack(zeros), "scales": scales}
        else:
            tensors = {"qweight": pack_plain(q, bits, 0), "qzeros": pack_plain(zeros - zero_offset, bits, 1),
                       "scales": scales, "g_idx": g_idx}
        yield name, tensors, dense


def save_quantized(root: Path, fmt: str, bits: int = 4, group_size: int = 64, sym: bool = False,
                   desc_act: bool = False, checkpoint_format: str = "gptq", seed: int = 0) -> tuple[Path, Path]:
    """An AWQ or GPTQ checkpoint of a random tiny Llama, and its dequantized twin. Returns both dirs."""
    quantized, dense_dir = root / f"{fmt}-quantized", root / f"{fmt}-dense"
    hf_model = save_random_hf_model(LlamaConfig(**QUANT_LLAMA, architectures=["LlamaForCausalLM"]), dense_dir, seed)
    save_byte_tokenizer(dense_dir)
    state = {k: v for k, v in hf_model.state_dict().items()}
    packed = {}
    zero_offset = 1 if checkpoint_format == "gptq" else 0
    for name, tensors, dense in _quantized_linears(hf_model, fmt, bits, group_size, sym, desc_act, zero_offset, seed):
        del state[f"{name}.weight"]
        packed.update({f"{name}.{part}": t for part, t in tensors.items()})
        hf_model.get_submodule(name).weight.data.copy_(dense)
    hf_model.save_pretrained(dense_dir)
    quantized.mkdir()
    save_file({**{k: v.contiguous() for k, v in state.items()}, **packed}, quantized / "model.safetensors")
    config = json.loads((dense_dir / "config.json").read_text())
    if fmt == "awq":
        config["quantization_config"] = {"quant_method": "awq", "bits": bits, "group_size": group_size,
                                         "zero_point": True, "version": "gemm"}
    else:
        config["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group_size,
                                         "sym": sym, "desc_act": desc_act, "checkpoint_format": checkpoint_format}
    (quantized / "config.json").write_text(json.dumps(config))
    save_byte_tokenizer(quantized)
    return quantized, dense_dir


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
GGUF_LINEARS = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert script: within each head, the two halves of the rows interleave."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def save_gguf(root: Path, qtypes: dict[str, GGMLQuantizationType], seed: int = 0) -> tuple[Path, Path]:
    """A GGUF ("llama") of a random tiny Llama whose linear layers are in qtypes[proj] (default Q4_1),
    written with the gguf package (its own quantize), and the HF-format dir of the dequantized
    weights (whose config.json and tokenizer serve the GGUF too). Returns (the .gguf file, dense dir)."""
    dense_dir = root / "gguf-dense"
    config = LlamaConfig(**QUANT_LLAMA, architectures=["LlamaForCausalLM"])
    hf_model = save_random_hf_model(config, dense_dir, seed)
    save_byte_tokenizer(dense_dir)
    path = root / "tiny.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(config.num_hidden_layers)
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    writer.add_tensor("token_embd.weight", hf_model.model.embed_tokens.weight.detach().numpy())
    writer.add_tensor("output_norm.weight", hf_model.model.norm.weight.detach().numpy())
    writer.add_tensor("output.weight", hf_model.lm_head.weight.detach().numpy())
    for i, layer in enumerate(hf_model.model.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight.detach().numpy())
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight.detach().numpy())
        for proj, gguf_name in GGUF_LINEARS.items():
            module = getattr(layer.self_attn if proj in ATTENTION else layer.mlp, proj)
            rows = module.weight.detach().numpy()                            # [N, K]
            order = np.arange(rows.shape[0])
            if proj in heads:
                order = llama_cpp_permute(order, heads[proj])
            qtype = qtypes.get(proj, GGMLQuantizationType.Q4_1)
            data = quantize(rows[order], qtype)
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", data, raw_dtype=qtype)
            restored = np.empty_like(rows)
            restored[order] = dequantize(data, qtype)
            module.weight.data.copy_(torch.from_numpy(restored))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    hf_model.save_pretrained(dense_dir)
    return path, dense_dir
