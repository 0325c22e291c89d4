import pytest
import torch

from gdserve.kernels.lora import LoRAMapping, add_lora, add_lora_reference
from tests.kernels.triton_cases import DEVICE, ON_CUDA, bf16_tol, randn, requires_triton

pytestmark = requires_triton
# (K, shard sizes, R): Llama-3-8B's qkv, gate_up and down on the device; unequal shards here.
LAYERS = ([(4096, (4096, 1024, 1024), 16), (4096, (14336, 14336), 64), (14336, (4096,), 64)] if ON_CUDA
          else [(40, (48, 16, 16), 16), (24, (20,), 32)])
NUM_SLOTS = 4
# The interpreter's tl.dot multiplies bfloat16 as raw uint16 bits: SGMV takes float16 there.
SGMV_HALF = torch.bfloat16 if ON_CUDA else torch.float16


def slot_patterns() -> dict[str, list[int]]:
    """Decode (a slot per token, some without), prefill chunks (segments), and a mix."""
    if ON_CUDA:
        decode = [(i * 7) % (NUM_SLOTS + 1) - 1 for i in range(64)]
        chunks = [1] * 700 + [-1] * 300 + [3] * 1024 + [0] * 24
        return {"one-token": [2], "decode": decode, "prefill": chunks, "mixed": decode + chunks[:900]}
    return {"one-token": [2], "decode": [0, 3, -1, 1, 1, 2, -1, 0], "prefill": [1] * 20 + [-1] * 5 + [3] * 18,
            "mixed": [0, 3, -1, 1] + [2] * 17}


PATTERNS = slot_patterns()


def operands(num_tokens: int, k: int, shard_sizes: tuple[int, ...], rank: int, dtype: torch.dtype):
    """x, y and zero-padded adapters (slot 2 uses a quarter of the rank, slot 1 has none)."""
    n = sum(shard_sizes)
    a = randn(NUM_SLOTS, len(shard_sizes), rank, k, seed=1, scale=k ** -0.5)
    b = randn(NUM_SLOTS, n, rank, seed=2, scale=rank ** -0.5)
    a[2, :, rank // 4:], b[2, :, rank // 4:] = 0, 0
    a[1], b[1] = 0, 0
    return randn(num_tokens, n, dtype=dtype, seed=3), randn(num_tokens, k, dtype=dtype, seed=4), a.to(dtype), b.to(dtype)


def expected_of(y, x, a, b, shard_sizes, slots) -> torch.Tensor:
    expected = y.float().clone()
    add_lora_reference(expected, x.float(), a.float(), b.float(), shard_sizes, LoRAMapping.build(slots, y.device))
    return expected


def assert_close_to(out: torch.Tensor, expected: torch.Tensor) -> None:
    tol = dict(atol=1e-4, rtol=1e-4) if out.dtype == torch.float32 else bf16_tol()
    torch.testing.assert_close(out.float(), expected, **tol)


@pytest.mark.parametrize("k,shard_sizes,rank", LAYERS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("kernel", ["bgmv", "sgmv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(k, shard_sizes, rank, pattern, kernel, dtype):
    from gdserve.kernels.triton.lora import add_lora_bgmv, add_lora_sgmv
    dtype = SGMV_HALF if kernel == "sgmv" and dtype == torch.bfloat16 else dtype
    slots = PATTERNS[pattern]
    y, x, a, b = operands(len(slots), k, shard_sizes, rank, dtype)
    expected = expected_of(y, x, a, b, shard_sizes, slots)
    mapping = LoRAMapping.build(slots, torch.device(DEVICE))
    if kernel == "bgmv":
        add_lora_bgmv(y, x, a, b, shard_sizes, mapping.token_slots)
    else:
        add_lora_sgmv(y, x, a, b, shard_sizes, mapping.segments, mapping.runs.max_length)
    assert_close_to(y, expected)


@pytest.mark.parametrize("split_k", [1, 3])
def test_bgmv_shrink_split_over_k(split_k):
    from gdserve.kernels.triton.lora import shrink_bgmv
    slots = PATTERNS["decode"]
    _, x, a, _ = operands(len(slots), 96, (32, 16), 16, torch.float32)
    mapping = LoRAMapping.build(slots, torch.device(DEVICE))
    h = shrink_bgmv(x, a, mapping.token_slots, block_c=16, block_k=16, split_k=split_k)
    rows = [t for t, s in enumerate(slots) if s >= 0]
    expected = torch.einsum("tk,tck->tc", x[rows], a.flatten(1, 2)[[slots[t] for t in rows]])
    torch.testing.assert_close(h[rows], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["bgmv", "sgmv"])
def test_small_tiles(kernel):
    """Several tiles of rows, columns and K per segment or token."""
    from gdserve.kernels.triton import lora
    slots = PATTERNS["prefill"]
    k, shard_sizes, rank = 72, (40, 24), 16
    y, x, a, b = operands(len(slots), k, shard_sizes, rank, torch.float32)
    expected = expected_of(y, x, a, b, shard_sizes, slots)
    mapping = LoRAMapping.build(slots, torch.device(DEVICE))
    if kernel == "bgmv":
        h = lora.shrink_bgmv(x, a, mapping.token_slots, block_c=16, block_k=32)
        for y_shard, h_shard, b_shard in lora._shards(y, h, b, shard_sizes):
            lora.expand_bgmv(y_shard, h_shard, b_shard, mapping.token_slots, block_n=16)
    else:
        args = mapping.segments, mapping.runs.max_length
        h = lora.shrink_sgmv(x, a, *args, block_m=16, block_c=16, block_k=32)
        for y_shard, h_shard, b_shard in lora._shards(y, h, b, shard_sizes):
            lora.expand_sgmv(y_shard, h_shard, b_shard, *args, block_m=16, block_n=16)
    assert_close_to(y, expected)


def test_graph_mapping_computes_each_copied_step():
    """The CUDA-graph path: one static mapping narrowed to the batch; each step's mapping copied
    in; the kernels read the slots on the device (the BGMV path, whatever the size)."""
    k, shard_sizes, rank = LAYERS[0]
    static = LoRAMapping.static(96, torch.device(DEVICE))
    batch = static.narrow(80)
    y, x, a, b = operands(80, k, shard_sizes, rank, torch.float32)
    before = y.clone()
    add_lora(y, x, a, b, shard_sizes, batch)  # at capture: all -1
    assert torch.equal(y, before)
    for slots in ([3] * 70, [0, -1, 2, 1] * 20):
        static.copy_(LoRAMapping.build(slots, torch.device(DEVICE)))
        y = before.clone()
        add_lora(y, x, a, b, shard_sizes, batch)
        assert_close_to(y, expected_of(before, x, a, b, shard_sizes, slots + [-1] * (80 - len(slots))))


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_cuda_graph_replays_other_mappings():
    k, shard_sizes, rank = LAYERS[0]
    static = LoRAMapping.static(256, torch.device(DEVICE))
    batch = static.narrow(128)
    y0, x, a, b = operands(128, k, shard_sizes, rank, torch.bfloat16)
    y = y0.clone()
    add_lora(y, x, a, b, shard_sizes, batch)  # warm-up (compiles) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_lora(y, x, a, b, shard_sizes, batch)
    for slots in ([1, 2, 3, -1] * 32, [0] * 100):
        static.copy_(LoRAMapping.build(slots, torch.device(DEVICE)))
        y.copy_(y0)
        graph.replay()
        assert_close_to(y, expected_of(y0, x, a, b, shard_sizes, slots + [-1] * (128 - len(slots))))


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
@pytest.mark.parametrize("pattern", PATTERNS)
def test_public_op_dispatches_on_cuda(pattern):
    k, shard_sizes, rank = LAYERS[0]
    slots = PATTERNS[pattern]
    y, x, a, b = operands(len(slots), k, shard_sizes, rank, torch.bfloat16)
    expected = expected_of(y, x, a, b, shard_sizes, slots)
    add_lora(y, x, a, b, shard_sizes, LoRAMapping.build(slots, torch.device(DEVICE)))
    assert_close_to(y, expected)
