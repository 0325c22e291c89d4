import pytest
import torch

from gdserve.kernels.lora import LoRAMapping, add_lora, add_lora_reference
from tests.kernels.triton_cases import DEVICE, ON_CUDA, bf16_tol, randn, requires_triton

pytestmark = requires_triton
# (K, shard sizes, R): Llama-3-8B's qkv, gate_up and down on the device; unequal shards here.
LAYERS = ([(4096, (4096, 1024, 1024), 16), (4096, (14336, 14336), 64), (14336, (4096,), 64)] if ON_CUDA
          else [(40, (48, 16, 16), 16), (24, (20,), 32)])
NUM_SLOTS = 4
TOKENS = (1, 3, 16, 17, 100, 256, 2048) if ON_CUDA else (1, 3, 16, 17, 100)


def slots_of(pattern: str, tokens: int) -> list[int]:
    """Decode (a slot per token, some without), prefill chunks (runs), no adapter, one adapter."""
    if pattern == "interleaved":
        return [(i * 7) % (NUM_SLOTS + 1) - 1 for i in range(tokens)]
    if pattern == "runs":
        return [(1, -1, 3, 0)[i * 4 // tokens] for i in range(tokens)]
    return [{"none": -1, "one-slot": 2}[pattern]] * tokens


PATTERNS = ("interleaved", "runs", "none", "one-slot")


def device() -> torch.device:
    return torch.device(DEVICE)


def operands(num_tokens: int, k: int, shard_sizes: tuple[int, ...], rank: int, dtype: torch.dtype):
    """y, x and zero-padded adapters (slot 2 uses a quarter of the rank, slot 1 has none)."""
    n = sum(shard_sizes)
    a = randn(NUM_SLOTS, len(shard_sizes), rank, k, seed=1, scale=k ** -0.5)
    b = randn(NUM_SLOTS, n, rank, seed=2, scale=rank ** -0.5)
    a[2, :, rank // 4:], b[2, :, rank // 4:] = 0, 0
    a[1], b[1] = 0, 0
    return randn(num_tokens, n, dtype=dtype, seed=3), randn(num_tokens, k, dtype=dtype, seed=4), a.to(dtype), b.to(dtype)


def expected_of(y, x, a, b, shard_sizes, slots) -> torch.Tensor:
    expected = y.float().clone()
    add_lora_reference(expected, x.float(), a.float(), b.float(), shard_sizes,
                       LoRAMapping.build(slots, NUM_SLOTS, y.device))
    return expected


def assert_close_to(out: torch.Tensor, expected: torch.Tensor) -> None:
    tol = dict(atol=1e-4, rtol=1e-4) if out.dtype == torch.float32 else bf16_tol()
    torch.testing.assert_close(out.float(), expected, **tol)


def add_lora_triton(y, x, a, b, shard_sizes, mapping: LoRAMapping) -> None:
    from gdserve.kernels.triton.lora import add_lora_triton
    add_lora_triton(y, x, a, b, shard_sizes, mapping.groups)


@pytest.mark.parametrize("k,shard_sizes,rank", LAYERS)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(k, shard_sizes, rank, tokens, pattern, dtype):
    slots = slots_of(pattern, tokens)
    y, x, a, b = operands(tokens, k, shard_sizes, rank, dtype)
    expected = expected_of(y, x, a, b, shard_sizes, slots)
    add_lora_triton(y, x, a, b, shard_sizes, LoRAMapping.build(slots, NUM_SLOTS, device()))
    assert_close_to(y, expected)


@pytest.mark.parametrize("pattern", ["interleaved", "runs"])
@pytest.mark.parametrize("split_k", [1, 3])
def test_small_tiles_and_split_over_k(pattern, split_k):
    """Several row tiles per group, column tiles across shard boundaries, K in several tiles,
    split over programs adding into h atomically."""
    from gdserve.kernels.triton import lora
    slots = slots_of(pattern, 100)
    k, shard_sizes, rank = 72, (40, 24), 16
    y, x, a, b = operands(len(slots), k, shard_sizes, rank, torch.float32)
    expected = expected_of(y, x, a, b, shard_sizes, slots)
    groups = LoRAMapping.build(slots, NUM_SLOTS, device()).groups
    h = lora.shrink(x, a, groups, block_m=16, block_c=16, block_k=16, split_k=split_k)
    lora.expand(y, h, b, shard_sizes, groups, block_m=16, block_n=16)
    assert_close_to(y, expected)


def test_split_over_k_by_default_for_few_tokens():
    from gdserve.kernels.triton.lora import block_m_for, split_k_for
    assert split_k_for(1, 4096, 48, device(), block_m_for(1), 64, 128) > 1
    assert split_k_for(8192, 4096, 48, device(), block_m_for(8192), 64, 128) <= 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrowed_mappings_skip_the_parents_later_tokens(dtype):
    """A narrowed mapping shares its parent's groups, which hold tokens past its own."""
    k, shard_sizes, rank = LAYERS[0]
    slots = slots_of("interleaved", 100)
    parent = LoRAMapping.build(slots, NUM_SLOTS, device())
    for tokens in (17, 3):
        y, x, a, b = operands(tokens, k, shard_sizes, rank, dtype)
        expected = expected_of(y, x, a, b, shard_sizes, slots[:tokens])
        add_lora_triton(y, x, a, b, shard_sizes, parent.narrow(tokens))
        assert_close_to(y, expected)


def test_graph_mapping_computes_each_copied_step():
    """The CUDA-graph path: one static mapping narrowed to the batch; each step's mapping (of at
    most the batch's tokens, or more: the batch skips the rest) copied in."""
    k, shard_sizes, rank = LAYERS[0]
    static = LoRAMapping.static(96, NUM_SLOTS, device())
    batch = static.narrow(80)
    y, x, a, b = operands(80, k, shard_sizes, rank, torch.float32)
    before = y.clone()
    add_lora_triton(y, x, a, b, shard_sizes, batch)  # at capture: all -1
    assert torch.equal(y, before)
    for slots in ([3] * 70, [0, -1, 2, 1] * 20, slots_of("interleaved", 17), slots_of("runs", 90)):
        static.copy_(LoRAMapping.build(slots, NUM_SLOTS, device()))
        y = before.clone()
        add_lora_triton(y, x, a, b, shard_sizes, batch)
        assert_close_to(y, expected_of(before, x, a, b, shard_sizes, (slots + [-1] * 80)[:80]))


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("batch_size", [1, 16, 128])
def test_cuda_graph_replays_other_mappings(batch_size):
    k, shard_sizes, rank = LAYERS[0]
    static = LoRAMapping.static(256, NUM_SLOTS, device())
    batch = static.narrow(batch_size)
    y0, x, a, b = operands(batch_size, k, shard_sizes, rank, torch.bfloat16)
    y = y0.clone()
    add_lora(y, x, a, b, shard_sizes, batch)  # warm-up (compiles) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_lora(y, x, a, b, shard_sizes, batch)
    for slots in ([1, 2, 3, -1] * 64, [0] * 100, [2], slots_of("runs", batch_size)):
        slots = slots[:batch_size]
        static.copy_(LoRAMapping.build(slots, NUM_SLOTS, device()))
        y.copy_(y0)
        graph.replay()
        assert_close_to(y, expected_of(y0, x, a, b, shard_sizes, slots + [-1] * (batch_size - len(slots))))


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
@pytest.mark.parametrize("pattern", PATTERNS)
def test_public_op_dispatches_on_cuda(pattern):
    k, shard_sizes, rank = LAYERS[0]
    slots = slots_of(pattern, 300)
    y, x, a, b = operands(len(slots), k, shard_sizes, rank, torch.bfloat16)
    expected = expected_of(y, x, a, b, shard_sizes, slots)
    add_lora(y, x, a, b, shard_sizes, LoRAMapping.build(slots, NUM_SLOTS, device()))
    assert_close_to(y, expected)
