"""Linear layers whose weights stay 4- or 8-bit in memory (AWQ, GPTQ, GGUF checkpoints): each
forward runs packed_gemm on the packed weight."""
from collections.abc import Callable

import torch
from torch import nn

from gdserve.kernels.packed_gemm import PackedWeight, device_layout, pack, packed_gemm, unpack


class PackedLinear(nn.Module):
    """y = x @ W + bias with W [K, N] quantized per group of group_size rows of K (PackedWeight).
    Several projections of one input may stack along N (shard_sizes, as MergedLinear): each is
    loaded on its own into its columns, which packing along K leaves independent."""

    def __init__(self, in_features: int, shard_sizes: list[int], bits: int, group_size: int, bias: bool,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None):
        super().__init__()
        check_packable(in_features, bits, group_size)
        self.in_features, self.out_features = in_features, sum(shard_sizes)
        self.shard_sizes, self.bits, self.group_size = list(shard_sizes), bits, group_size
        dtype = dtype or torch.get_default_dtype()
        n, groups = self.out_features, in_features // group_size
        self.register_buffer("qweight", torch.empty(in_features * bits // 32, n, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.empty(groups, n, dtype=dtype, device=device))
        self.register_buffer("biases", torch.empty(groups, n, dtype=dtype, device=device))
        # Set when a checkpoint's groups are not runs of consecutive rows (GPTQ desc_act): its rows
        # are stored sorted by group, and x's columns are taken in the same order.
        self.register_buffer("perm", None)
        self.bias = nn.Parameter(torch.empty(n, dtype=dtype, device=device)) if bias else None
        self.loaded_shards: set[int] = set()
        self.layout = "rows"  # until finish_loading picks the device's

    @property
    def packed(self) -> PackedWeight:
        return PackedWeight(self.qweight, self.scales, self.biases, self.bits, self.group_size, self.layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.perm is not None:
            rows = rows[:, self.perm]
        out = packed_gemm(rows, self.packed).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    @torch.no_grad()
    def load_shard(self, index: int, weight: PackedWeight, perm: torch.Tensor | None = None) -> None:
        """Copy one projection's packed weight into the columns of shard `index`. The shards of a
        layer share its input, so they must share its column order (perm) too. A 4-bit shard of an
        8-bit layer widens exactly (same scales and biases)."""
        name = f"shard {index} of {self.shard_sizes}"
        if self.layout != "rows":
            raise ValueError(f"{name}: the layer's weights are already repacked for the device")
        if weight.bits < self.bits:
            weight = PackedWeight(pack(unpack(weight.qweight, weight.bits), self.bits), weight.scales,
                                  weight.biases, self.bits, weight.group_size)
        if (weight.bits, weight.group_size) != (self.bits, self.group_size):
            raise ValueError(f"{name}: {weight.bits}-bit, group {weight.group_size}; the layer is "
                             f"{self.bits}-bit, group {self.group_size}")
        if (weight.in_features, weight.out_features) != (self.in_features, self.shard_sizes[index]):
            raise ValueError(f"{name}: a weight of {weight.in_features} x {weight.out_features} (in x out), "
                             f"expected {self.in_features} x {self.shard_sizes[index]}")
        perm = None if perm is None else perm.to(self.qweight.device, torch.int64)
        if self.loaded_shards and not _same(perm, self.perm):
            raise ValueError(f"{name}: its g_idx orders the input rows differently from the layer's "
                             "other shards, which read the same input; they cannot share one GEMM")
        self.perm = perm
        for target, source in ((self.qweight, weight.qweight), (self.scales, weight.scales),
                               (self.biases, weight.biases)):
            self.shard(target, index, dim=1).copy_(source)
        self.loaded_shards.add(index)

    @torch.no_grad()
    def finish_loading(self) -> None:
        """Once every shard is in: the weight in its device's layout (device_layout), made once."""
        weight = device_layout(self.packed)
        self.qweight, self.layout = weight.qweight, weight.layout

    def shard(self, tensor: torch.Tensor, index: int, dim: int = 0) -> torch.Tensor:
        """The part of a [.., N] buffer (dim 1) or of the bias (dim 0) that belongs to shard `index`."""
        return tensor.narrow(dim, sum(self.shard_sizes[:index]), self.shard_sizes[index])

    def num_bytes(self) -> int:
        """Resident bytes of the weight (the bias apart)."""
        tensors = [self.qweight, self.scales, self.biases] + ([self.perm] if self.perm is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, bias={self.bias is not None}, layout={self.layout}")


def pack_linears(model: nn.Module, layout: Callable[[str], tuple[int, int]],
                 skip: tuple[nn.Module, ...] = ()) -> list[str]:
    """Replace, in place, every nn.Linear of model not in skip by an empty PackedLinear of the same
    shape, shards, dtype and device (meta included: the loader swaps before allocating), with the
    (bits, group_size) layout(name) gives; group_size -1: one group over all of in_features.
    Returns the swapped layers' names."""
    targets = [(f"{prefix}.{name}".lstrip("."), parent, name, child) for prefix, parent in model.named_modules()
               for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and not any(child is s for s in skip)]
    layouts = {}
    for full_name, _, _, linear in targets:  # all checked before any is swapped
        bits, group_size = layout(full_name)
        layouts[full_name] = bits, linear.in_features if group_size == -1 else group_size
        try:
            check_packable(linear.in_features, *layouts[full_name])
        except ValueError as e:
            raise ValueError(f"{full_name}: {e}") from None
    for full_name, parent, name, linear in targets:
        shard_sizes = getattr(linear, "shard_sizes", [linear.out_features])
        setattr(parent, name, PackedLinear(linear.in_features, shard_sizes, *layouts[full_name],
                                           linear.bias is not None, linear.weight.dtype, linear.weight.device))
    return [full_name for full_name, *_ in targets]


def check_packable(in_features: int, bits: int, group_size: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"{bits}-bit weights are not supported (packed weights are 4- or 8-bit)")
    if group_size <= 0 or in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {in_features}")
    if in_features * bits % 32:
        raise ValueError(f"in_features {in_features} does not fill whole int32 words at {bits} bits")


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)
