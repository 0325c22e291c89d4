"""The tensor-parallel layers on two ranks against the unsharded layer: each rank loads its shard
of the same full weights and the sharded forward gives the full layer's output."""
import pytest
import torch
from torch import nn

from gdserve.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from gdserve.layers.quantization import Fp8RowParallelLinear, quantize_linears
from gdserve.layers.vocab_parallel_embedding import VocabParallelEmbedding
from tests.distributed.ranks import DEVICES, run_ranks


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def load(layer: nn.Module, weights: list[tuple[str, torch.Tensor, int]], device: torch.device) -> nn.Module:
    layer = layer.to(device)
    for attr, tensor, index in weights:
        layer.weight_loader(getattr(layer, attr), tensor, index)
    return layer


def column_parallel(rank: int, size: int, device: torch.device) -> None:
    gate, up, bias, x = seeded(48, 32, seed=1), seeded(48, 32, seed=2), seeded(48, seed=3), seeded(5, 32, seed=4)
    layer = load(ColumnParallelLinear(32, [48, 48], bias=True),
                 [("weight", gate, 0), ("weight", up, 1), ("bias", bias, 0), ("bias", bias, 1)], device)
    out = layer(x.to(device)).cpu()
    rows = slice(rank * 24, (rank + 1) * 24)
    torch.testing.assert_close(out, torch.cat([x @ gate[rows].T + bias[rows], x @ up[rows].T + bias[rows]], -1))


def qkv_parallel(rank: int, size: int, device: torch.device, num_kv_heads: int = 2) -> None:
    head_dim, heads = 8, 4
    q, k, v = seeded(heads * head_dim, 16, seed=1), seeded(num_kv_heads * head_dim, 16, seed=2), \
        seeded(num_kv_heads * head_dim, 16, seed=3)
    layer = load(QKVParallelLinear(16, head_dim, heads, num_kv_heads, bias=False),
                 [("weight", q, 0), ("weight", k, 1), ("weight", v, 2)], device)
    x = seeded(3, 16, seed=4)
    kv_head = rank * num_kv_heads // size  # with fewer KV heads than ranks, shared by neighbours
    kv_rows = slice(kv_head * head_dim, kv_head * head_dim + layer.num_kv_heads * head_dim)
    q_rows = slice(rank * 2 * head_dim, (rank + 1) * 2 * head_dim)
    expected = torch.cat([x @ q[q_rows].T, x @ k[kv_rows].T, x @ v[kv_rows].T], -1)
    assert layer.num_heads == 2 and layer.num_kv_heads == max(1, num_kv_heads // size)
    torch.testing.assert_close(layer(x.to(device)).cpu(), expected)


def qkv_parallel_replicated_kv(rank: int, size: int, device: torch.device) -> None:
    qkv_parallel(rank, size, device, num_kv_heads=1)


def row_parallel(rank: int, size: int, device: torch.device) -> None:
    weight, bias, x = seeded(24, 64, seed=1), seeded(24, seed=2), seeded(5, 64, seed=3)
    layer = load(RowParallelLinear(64, 24, bias=True), [("weight", weight, 0), ("bias", bias, 0)], device)
    shard = x[:, rank * 32:(rank + 1) * 32].to(device)  # a column-parallel layer's output on this rank
    torch.testing.assert_close(layer(shard).cpu(), x @ weight.T + bias)


def fp8_row_parallel(rank: int, size: int, device: torch.device) -> None:
    weight, x = seeded(32, 64, seed=1), seeded(5, 64, seed=3)
    model = nn.Sequential(load(RowParallelLinear(64, 32, bias=False), [("weight", weight, 0)], device))
    quantize_linears(model, "fp8")
    assert isinstance(model[0], Fp8RowParallelLinear)
    out = model[0](x[:, rank * 32:(rank + 1) * 32].to(device)).float().cpu()
    expected = x @ weight.T
    assert (out - expected).norm() / expected.norm() < 0.1  # each rank's half rounded to fp8, then summed


def vocab_parallel(rank: int, size: int, device: torch.device) -> None:
    vocab, hidden = 259, 16  # odd: the last rank's rows end in padding
    for dtype in (torch.float32, torch.bfloat16):
        weight = seeded(vocab, hidden, seed=1).to(dtype)
        layer = load(VocabParallelEmbedding(vocab, hidden).to(dtype), [("weight", weight, 0)], device)
        ids = torch.tensor([0, 5, 129, 130, 258, 7])
        torch.testing.assert_close(layer(ids.to(device)).cpu(), weight[ids])
        h = seeded(3, hidden, seed=2).to(dtype)
        logits = layer.compute_logits(h.to(device))
        if rank == 0:  # gathered in the weight's dtype, the padding dropped
            assert logits.dtype == dtype and logits.shape == (3, vocab)
            torch.testing.assert_close(logits.cpu(), h @ weight.T)
        else:
            assert logits is None


def every_layer(rank: int, size: int, device: torch.device) -> None:
    """One group for all the checks: starting one costs seconds."""
    for check in (column_parallel, qkv_parallel, qkv_parallel_replicated_kv, row_parallel, fp8_row_parallel,
                  vocab_parallel):
        check(rank, size, device)


@pytest.mark.parametrize("device_type", DEVICES)
def test_two_ranks_match_the_unsharded_layers(device_type):
    run_ranks(every_layer, 2, device_type)


def test_one_rank_holds_the_whole_layer():
    weight = seeded(24, 64)
    layer = RowParallelLinear(64, 24, bias=False)
    layer.weight_loader(layer.weight, weight)
    x = seeded(3, 64, seed=1)
    torch.testing.assert_close(layer(x), x @ weight.T)


def test_a_checkpoint_of_the_wrong_shape_is_refused():
    layer = ColumnParallelLinear(32, [48, 48], bias=False)
    with pytest.raises(ValueError, match=r"checkpoint shape \(40, 32\), model expects \(48, 32\)"):
        layer.weight_loader(layer.weight, seeded(40, 32), 1)
