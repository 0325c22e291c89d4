"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2): the differences are config-driven.
Tokens are flat ([T], no batch dim); attention goes through the paged KV cache."""
from collections.abc import Callable, Iterable

import torch
from torch import nn

from gdserve.layers.activation import SiluAndMul
from gdserve.layers.attention import Attention, AttentionMetadata
from gdserve.kernels.packed_gemm import PackedWeight
from gdserve.layers.checkpoint import CheckpointTensor, default_weight_loader
from gdserve.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from gdserve.layers.norm import RMSNorm
from gdserve.layers.packed_linear import PackedLinear, pack_linears
from gdserve.layers.quantization import Fp8Linear, quantize_linears
from gdserve.layers.rotary import RotaryEmbedding, apply_rotary
from gdserve.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from gdserve.models.config import ModelConfig

# Our fused projection -> the HF checkpoint projections stacked in it, in order.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
SHARD_OF = {hf: (fused, i) for fused, hfs in FUSED.items() for i, hf in enumerate(hfs)}


class LlamaAttention(nn.Module):
    """This rank's heads (all of them on one device): q, k, v column-parallel by head, o_proj
    row-parallel."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, config.num_attention_heads,
                                          config.num_key_value_heads, bias=config.attention_bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, config.hidden_size,
                                        bias=config.o_proj_bias)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim,
                              scale=self.head_dim ** -0.5)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        qk, v = self.qkv_proj(x).split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # q and k sit side by side in the projection: one pass turns both (by the rotary
        # embedding, then by fp8 attention's rotation where it is on).
        qk = apply_rotary(qk.view(-1, self.num_heads + self.num_kv_heads, self.head_dim), *rope, self.attn.rotation)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)  # [T, H, D], [T, KVH, D]
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v, meta))      # attn: [T, H * D]


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [inter, inter], bias=config.mlp_bias)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                residual: torch.Tensor | None, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                          config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        rope = self.rotary_emb(positions, x.dtype)
        for layer in self.layers:
            x, residual = layer(rope, x, residual, meta)
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        # Tied: the embedding module itself, so the tie survives to_empty() and .to().
        self.lm_head = (self.model.embed_tokens if config.tie_word_embeddings
                        else ParallelLMHead(config.vocab_size, config.hidden_size))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [T] -> final-normed hidden states [T, hidden]."""
        return self.model(input_ids, positions, meta)

    def quantize(self, method: str) -> None:
        """Quantize the loaded linear layers (the LM head apart)."""
        quantize_linears(self, method, skip=(self.lm_head,))
        self.fuse_activation_quant()

    def fuse_activation_quant(self) -> None:
        """Let each norm or activation quantize its output in its own kernel where its one reader
        is an Fp8Linear (and not where that reader is wrapped, e.g. by LoRA, which reads the
        unquantized activation too)."""
        for layer in self.model.layers:
            layer.input_layernorm.quant_fp8 = isinstance(layer.self_attn.qkv_proj, Fp8Linear)
            layer.post_attention_layernorm.quant_fp8 = isinstance(layer.mlp.gate_up_proj, Fp8Linear)
            layer.mlp.act_fn.quant_fp8 = isinstance(layer.mlp.down_proj, Fp8Linear)

    def pack_linears(self, layout: Callable[[str], tuple[int, int]]) -> None:
        """Swap the linear layers (the LM head apart) for empty PackedLinears. layout: the (bits,
        group_size) of a checkpoint projection by its HF module name; a fused layer takes its
        projections' widest bits (narrower ones widen exactly as they load)."""
        def fused_layout(name: str) -> tuple[int, int]:
            parent, _, leaf = name.rpartition(".")
            layouts = [layout(f"{parent}.{hf}") for hf in FUSED.get(leaf, (leaf,))]
            group_sizes = {group_size for _, group_size in layouts}
            if len(group_sizes) > 1:
                raise ValueError(f"{name}: its projections come in group sizes {sorted(group_sizes)}; "
                                 "one fused GEMM needs one")
            return max(bits for bits, _ in layouts), group_sizes.pop()

        pack_linears(self, fused_layout, skip=(self.lm_head,))

    def packed_projection_names(self) -> set[str]:
        """The HF module names of the checkpoint projections the PackedLinears take."""
        names = set()
        for name, module in self.named_modules():
            if isinstance(module, PackedLinear):
                parent, _, leaf = name.rpartition(".")
                names.update(f"{parent}.{hf}" for hf in FUSED.get(leaf, (leaf,)))
        return names

    def load_packed(self, name: str, weight: PackedWeight, perm: torch.Tensor | None = None) -> None:
        """Copy a checkpoint projection (HF module name, e.g. model.layers.0.self_attn.q_proj),
        packed, into its PackedLinear or its shard of a fused one."""
        parent, _, leaf = name.rpartition(".")
        fused, index = SHARD_OF.get(leaf, (leaf, 0))
        module = self.get_submodule(f"{parent}.{fused}")
        if not isinstance(module, PackedLinear):
            raise ValueError(f"quantized weight {name!r}: {parent}.{fused} is not a packed linear layer")
        try:
            module.load_shard(index, weight, perm)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[N, hidden] -> [N, vocab] in the LM head's dtype (None on tensor-parallel ranks other than 0)"""
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, CheckpointTensor]]) -> None:
        """Copy HF-named checkpoint tensors in (cast to our dtype and device), each layer taking
        its tensor-parallel shard of them (a lazy slice is read only there); every expected name
        must come exactly once and no other."""
        expected = self._checkpoint_names()
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):  # old checkpoints save this buffer
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints repeat the embedding here
            if name not in expected:
                raise ValueError(f"unexpected weight {name!r} for {self.config.architecture}")
            if name in loaded:
                raise ValueError(f"weight {name!r} appears twice in the checkpoint")
            try:
                self._load_one(name, tensor)
            except ValueError as e:
                raise ValueError(f"weight {name!r}: {e}") from None
            loaded.add(name)
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} weights: {', '.join(missing[:8])}"
                             + (", ..." if len(missing) > 8 else ""))

    def _checkpoint_names(self) -> set[str]:
        """Our parameter names with each fused projection split back into its HF ones."""
        names = set()
        for name, _ in self.named_parameters():
            module_path, _, attr = name.rpartition(".")
            parent, _, leaf = module_path.rpartition(".")
            if leaf in FUSED:
                names.update(f"{parent}.{hf_leaf}.{attr}" for hf_leaf in FUSED[leaf])
            else:
                names.add(name)
        return names

    def _load_one(self, name: str, tensor: CheckpointTensor) -> None:
        """Fill the parameter (or this rank's share of it, or of a fused one) that checkpoint
        tensor `name` is for."""
        module, param, index = self._locate(name)
        loader = getattr(module, "weight_loader", None)
        if loader is None:
            default_weight_loader(param, tensor)
        else:
            loader(param, tensor, index)

    def _target(self, name: str) -> torch.Tensor:
        """The parameter (or the slice of a fused one) that checkpoint tensor `name` fills, on one
        rank (the whole model)."""
        module, param, index = self._locate(name)
        return module.shard(param, index) if hasattr(module, "shard") else param

    def _locate(self, name: str) -> tuple[nn.Module, torch.Tensor, int]:
        """(module, parameter, projection index in a fused module) of checkpoint tensor `name`."""
        module_path, _, attr = name.rpartition(".")
        parent, _, leaf = module_path.rpartition(".")
        fused, index = SHARD_OF.get(leaf, (leaf, 0))
        module = self.get_submodule(f"{parent}.{fused}" if parent else fused)
        return module, getattr(module, attr), index
