"""GGUF (llama.cpp) tensors -> our checkpoint names. Linear layers in Q4_0, Q4_1 or Q8_0 stay packed
(blocks of 32 along K, one fp16 scale each, Q4_1 with an fp16 offset too); every other tensor
(embeddings, norms, the output head, biases) is dequantized. llama.cpp stores the q and k rows of
a "llama" model interleaved for its rotary kernel: they are put back in HF's order."""
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

from gdserve.kernels.packed_gemm import PackedWeight, pack
from gdserve.quant.config import PackedProjection

BLOCK = 32
PACKED_TYPES = {GGMLQuantizationType.Q4_0: 4, GGMLQuantizationType.Q4_1: 4, GGMLQuantizationType.Q8_0: 8}
ARCHITECTURES = ("llama", "qwen2")
_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}
_LAYER_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_SKIPPED = ("rope_freqs",)  # llama 3's rotary scaling table: ours comes from config.json


class GGUFCheckpoint:
    def __init__(self, path: Path):
        self.path = path
        self.reader = GGUFReader(path)
        field = self.reader.fields.get("general.architecture")
        self.architecture = field.contents() if field is not None else None
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{path.name}: GGUF architecture {self.architecture!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")

    def linear_layouts(self) -> dict[str, tuple[int, int]]:
        """HF module name (model.layers.0.self_attn.q_proj) -> (bits, group_size) of each linear layer."""
        layouts = {}
        for tensor in self.reader.tensors:
            name = _hf_name(tensor.name)
            if _is_linear_weight(tensor.name):
                layouts[name.removesuffix(".weight")] = (_packed_bits(tensor), BLOCK)
        return layouts

    def weights(self, num_heads: int, num_kv_heads: int,
                dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor | PackedProjection]]:
        """(HF name, tensor) for dense tensors, (HF module name, PackedProjection) for linear layers."""
        for tensor in self.reader.tensors:
            if tensor.name.split(".")[0] in _SKIPPED:
                continue
            name, heads = _hf_name(tensor.name), self._rotary_heads(tensor.name, num_heads, num_kv_heads)
            if _is_linear_weight(tensor.name):
                weight = _packed(tensor, dtype)
                if heads:
                    weight = _select_columns(weight, _rotary_order(weight.out_features, heads))
                yield name.removesuffix(".weight"), PackedProjection(weight)
            else:
                dense = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type)))
                if heads:
                    dense = dense[_rotary_order(dense.shape[0], heads)]
                yield name, dense

    def _rotary_heads(self, gguf_name: str, num_heads: int, num_kv_heads: int) -> int:
        """The heads whose rows llama.cpp interleaved in this tensor (0: none)."""
        if self.architecture != "llama":
            return 0
        kind = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
        return {"attn_q": num_heads, "attn_k": num_kv_heads}.get(kind, 0)


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4:
        layer, kind, attr = parts[1:]
        module = _LINEARS.get(kind) or _LAYER_NORMS.get(kind)
        if module is not None:
            return f"model.layers.{layer}.{module}.{attr}"
    elif len(parts) == 2 and parts[0] in _TOP:
        return f"{_TOP[parts[0]]}.{parts[1]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def _is_linear_weight(gguf_name: str) -> bool:
    parts = gguf_name.split(".")
    return parts[0] == "blk" and len(parts) == 4 and parts[2] in _LINEARS and parts[3] == "weight"


def _packed_bits(tensor: ReaderTensor) -> int:
    if tensor.tensor_type not in PACKED_TYPES:
        raise ValueError(f"GGUF tensor {tensor.name} is {tensor.tensor_type.name}: quantization 'gguf' keeps "
                         f"only {', '.join(t.name for t in PACKED_TYPES)} packed; load without it to "
                         "dequantize the model at load")
    return PACKED_TYPES[tensor.tensor_type]


def _packed(tensor: ReaderTensor, dtype: torch.dtype) -> PackedWeight:
    """A linear weight's blocks -> PackedWeight [K, N]: GGUF stores N rows of K (ne0 = K)."""
    bits = _packed_bits(tensor)
    in_features, out_features = (int(n) for n in tensor.shape)
    blocks = torch.from_numpy(np.array(tensor.data)).view(out_features, in_features // BLOCK, -1)
    scales = blocks[..., :2].contiguous().view(torch.float16)[..., 0].float()     # d: [N, K / 32]
    if tensor.tensor_type == GGMLQuantizationType.Q8_0:
        q = blocks[..., 2:] ^ 0x80                       # int8 bytes -> unsigned q + 128
        biases = -128 * scales
    else:
        offset = 4 if tensor.tensor_type == GGMLQuantizationType.Q4_1 else 2
        qs = blocks[..., offset:]                                                 # [N, K / 32, 16]
        q = torch.cat([qs & 0xF, qs >> 4], dim=-1)     # low nibbles: elements 0..15, high: 16..31
        biases = (blocks[..., 2:4].contiguous().view(torch.float16)[..., 0].float()  # m
                  if tensor.tensor_type == GGMLQuantizationType.Q4_1 else -8 * scales)
    q = q.reshape(out_features, in_features).t().contiguous()
    return PackedWeight(pack(q, bits), scales.t().to(dtype).contiguous(), biases.t().to(dtype).contiguous(),
                        bits, BLOCK)


def _rotary_order(rows: int, heads: int) -> torch.Tensor:
    """HF's row order from llama.cpp's: within a head, rows (i, half) go back to (half, i)."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def _select_columns(weight: PackedWeight, columns: torch.Tensor) -> PackedWeight:
    return PackedWeight(weight.qweight[:, columns], weight.scales[:, columns], weight.biases[:, columns],
                        weight.bits, weight.group_size)
