import pytest
import torch

from gdserve.kernels import lora, native
from gdserve.kernels.lora import LoRAMapping, add_lora, add_lora_reference

QKV = (48, 16, 16)  # unequal shards, as q, k, v
NUM_SLOTS = 4
CPU = torch.device("cpu")


def lora_weights(num_slots: int, shard_sizes: tuple[int, ...], rank: int, k: int, dtype=torch.float32,
                 used_rank: int | None = None, seed: int = 0):
    """lora_a [slots, shards, R, K], lora_b [slots, N, R]; ranks above used_rank zero, as padding leaves them."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(num_slots, len(shard_sizes), rank, k, generator=g) / k ** 0.5
    b = torch.randn(num_slots, sum(shard_sizes), rank, generator=g) / rank ** 0.5
    if used_rank is not None:
        a[:, :, used_rank:] = 0
        b[:, :, used_rank:] = 0
    return a.to(dtype), b.to(dtype)


def operands(token_slots: list[int], shard_sizes=QKV, rank: int = 8, k: int = 40, num_slots: int = NUM_SLOTS,
             dtype=torch.float32, used_rank: int | None = None):
    g = torch.Generator().manual_seed(len(token_slots))
    x = torch.randn(len(token_slots), k, generator=g).to(dtype)
    y = torch.randn(len(token_slots), sum(shard_sizes), generator=g).to(dtype)
    a, b = lora_weights(num_slots, shard_sizes, rank, k, dtype, used_rank)
    return y, x, a, b


def naive(y, x, lora_a, lora_b, shard_sizes, token_slots: list[int]) -> torch.Tensor:
    """The definition, one token and one shard at a time, in float64."""
    out = y.double().clone()
    for t, slot in enumerate(token_slots):
        off = 0
        for i, n in enumerate(shard_sizes):
            if slot >= 0:
                h = x[t].double() @ lora_a[slot, i].double().T
                out[t, off:off + n] += h @ lora_b[slot, off:off + n].double().T
            off += n
    return out


MIXED = [2, 2, -1, 0, 3, 3, 3, -1, -1, 1, 0, 2]
SLOT_PATTERNS = {
    "one-token": [1],
    "mixed": MIXED,
    "interleaved": [0, 1, 2, 3, -1, 1, 0, 3],                 # decode: a slot per sequence
    "segments": [1] * 20 + [-1] * 7 + [3] * 30 + [0] * 9,     # prefill chunks
    "one-slot": [2] * 16,
}


@pytest.mark.parametrize("pattern", SLOT_PATTERNS)
@pytest.mark.parametrize("shard_sizes", [QKV, (64,), (32, 32)], ids=["qkv", "one", "gate-up"])
def test_reference_matches_per_token_loop(pattern, shard_sizes):
    slots = SLOT_PATTERNS[pattern]
    y, x, a, b = operands(slots, shard_sizes, used_rank=5)
    expected = naive(y, x, a, b, shard_sizes, slots)
    add_lora_reference(y, x, a, b, shard_sizes, LoRAMapping.build(slots, NUM_SLOTS, CPU))
    torch.testing.assert_close(y.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.fixture(params=["native", "torch"])
def cpu_path(request, monkeypatch) -> str:
    """Every step through the native kernel, or through the torch matmuls (per run or masked)."""
    if request.param == "native":
        if native.library() is None:
            pytest.skip("no C compiler for the native CPU kernels")
        monkeypatch.setattr(lora, "NATIVE_ALWAYS", 1 << 30)
    else:
        monkeypatch.setattr(lora, "NATIVE_ALWAYS", 0)
        monkeypatch.setattr(lora, "NATIVE_MAX_TOKENS", dict.fromkeys(lora.NATIVE_MAX_TOKENS, 0))
    return request.param


@pytest.mark.parametrize("pattern", SLOT_PATTERNS)
@pytest.mark.parametrize("shard_sizes", [QKV, (64,)], ids=["qkv", "one"])
@pytest.mark.parametrize("rank", [8, 12])
def test_cpu_path_matches_reference(cpu_path, pattern, shard_sizes, rank):
    slots = SLOT_PATTERNS[pattern]
    y, x, a, b = operands(slots, shard_sizes, rank=rank, used_rank=5)
    expected = y.clone()
    mapping = LoRAMapping.build(slots, NUM_SLOTS, CPU)
    add_lora_reference(expected, x, a, b, shard_sizes, mapping)
    add_lora(y, x, a, b, shard_sizes, mapping)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pattern", ["mixed", "segments"])
def test_16_bit_inputs_accumulate_in_float32(cpu_path, dtype, pattern):
    slots = SLOT_PATTERNS[pattern]
    y, x, a, b = operands(slots, dtype=dtype)
    mapping = LoRAMapping.build(slots, NUM_SLOTS, CPU)
    expected = naive(y, x, a, b, QKV, slots)
    reference, fast = y.clone(), y.clone()
    add_lora_reference(reference, x, a, b, QKV, mapping)
    add_lora(fast, x, a, b, QKV, mapping)
    assert reference.dtype == fast.dtype == dtype
    # The reference rounds once, at the end; the torch matmuls also round the rank-R product.
    torch.testing.assert_close(reference.double(), expected, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(fast.double(), expected, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("op", [add_lora, add_lora_reference])
def test_tokens_without_adapter_are_untouched(cpu_path, op):
    slots = [-1] * 6
    y, x, a, b = operands(slots)
    before = y.clone()
    op(y, x, a, b, QKV, LoRAMapping.build(slots, NUM_SLOTS, CPU))
    assert torch.equal(y, before)
    empty = operands([])
    op(*empty, QKV, LoRAMapping.build([], NUM_SLOTS, CPU))
    assert empty[0].shape == (0, sum(QKV))


def test_static_mapping_takes_the_copied_slots(cpu_path):
    """What a CUDA graph's runner does: one static mapping, narrowed to the step's size, with each
    step's mapping copied in; the tokens past the copy fall back to the base model."""
    static = LoRAMapping.static(16, NUM_SLOTS, CPU)
    step = static.narrow(12)
    y, x, a, b = operands(MIXED)
    before = y.clone()
    add_lora(y, x, a, b, QKV, step)  # all -1 (graph capture): nothing changes
    assert torch.equal(y, before)
    for slots in (MIXED[:9], MIXED[3:]):
        static.copy_(LoRAMapping.build(slots, NUM_SLOTS, CPU))
        assert static.token_slots.tolist() == slots + [-1] * (16 - len(slots))
        out, expected = before.clone(), before.clone()
        add_lora(out, x, a, b, QKV, step)
        add_lora_reference(expected, x, a, b, QKV, LoRAMapping.build(slots + [-1] * (12 - len(slots)), NUM_SLOTS, CPU))
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_narrow_and_copy_of_a_built_mapping():
    mapping = LoRAMapping.build(MIXED, NUM_SLOTS, CPU)
    head = mapping.narrow(5)
    assert head.token_slots.tolist() == MIXED[:5]
    assert (head.runs.starts, head.runs.lengths, head.runs.slots) == ((0, 3, 4), (2, 1, 1), (2, 0, 3))
    assert head.groups is mapping.groups  # the kernels skip the parent's tokens past 5
    head.token_slots.zero_()
    assert mapping.token_slots[:5].tolist() == [0] * 5  # a view
    target = LoRAMapping.build([0] * 8, NUM_SLOTS, CPU)
    target.copy_(LoRAMapping.build([3, -1, 3], NUM_SLOTS, CPU))
    assert target.token_slots.tolist() == [3, -1, 3] + [-1] * 5
    assert (target.runs.starts, target.runs.lengths, target.runs.slots) == ((0, 2), (1, 1), (3, 3))


def groups_of(mapping: LoRAMapping) -> tuple[list[int], list[int], list[int]]:
    groups = mapping.groups
    return groups.sorted_indices.tolist(), groups.slot_counts.tolist(), groups.slot_starts.tolist()


def test_groups_sort_tokens_by_slot_in_token_order():
    assert groups_of(LoRAMapping.build(MIXED, NUM_SLOTS, CPU)) == (
        [3, 10, 9, 0, 1, 11, 4, 5, 6, 2, 7, 8], [2, 1, 3, 3], [0, 2, 3, 6])
    assert groups_of(LoRAMapping.build([-1, -1], NUM_SLOTS, CPU)) == ([0, 1], [0] * 4, [0] * 4)
    assert groups_of(LoRAMapping.build([], NUM_SLOTS, CPU)) == ([], [0] * 4, [0] * 4)
    assert groups_of(LoRAMapping.build([2, 2, 2], NUM_SLOTS, CPU)) == ([0, 1, 2], [0, 0, 3, 0], [0, 0, 0, 3])


def test_static_groups_follow_each_copy():
    """A graph reads the static mapping's group tensors: copy_ rewrites them in place, and the
    rows past the copy (-1) join no slot."""
    static = LoRAMapping.static(6, NUM_SLOTS, CPU)
    groups = static.groups
    assert groups_of(static) == ([0, 1, 2, 3, 4, 5], [0] * 4, [0] * 4)
    batch = static.narrow(4)
    static.copy_(LoRAMapping.build([1, 3, 1], NUM_SLOTS, CPU))
    assert groups_of(batch) == groups_of(static) == ([0, 2, 1, 3, 4, 5], [0, 2, 0, 1], [0, 0, 2, 2])
    assert static.groups is groups  # rewritten in place


def test_mapping_errors_name_the_problem():
    with pytest.raises(ValueError, match="got -2"):
        LoRAMapping.build([0, -2], NUM_SLOTS, CPU)
    with pytest.raises(ValueError, match="slots 0..3 or -1 .no adapter., got 4"):
        LoRAMapping.build([0, 4], NUM_SLOTS, CPU)
    with pytest.raises(ValueError, match="over 8 slots into one over 4"):
        LoRAMapping.static(2, NUM_SLOTS, CPU).copy_(LoRAMapping.build([0, 7], 8, CPU))
    with pytest.raises(ValueError, match="narrowed mapping"):
        LoRAMapping.static(4, NUM_SLOTS, CPU).narrow(3).copy_(LoRAMapping.build([0, 1], NUM_SLOTS, CPU))
    with pytest.raises(ValueError, match="do not fit"):
        LoRAMapping.static(2, NUM_SLOTS, CPU).copy_(LoRAMapping.build([0, 1, 2], NUM_SLOTS, CPU))
    with pytest.raises(ValueError, match="narrow"):
        LoRAMapping.static(2, NUM_SLOTS, CPU).narrow(3)


def mismatched_cases() -> dict:
    """The expected message -> add_lora's arguments."""
    slots = [0, 1, -1]
    y, x, a, b = operands(slots)
    mapping = LoRAMapping.build(slots, NUM_SLOTS, CPU)
    return {
        "x has 3 tokens, y 2": (y[:2], x, a, b, QKV, mapping),
        "the mapping 2": (y, x, a, b, QKV, mapping.narrow(2)),
        r"shard_sizes \(48, 16\) against y.s 64 columns and lora_a.s 3 shards": (y[:, :64], x, a, b[:, :64], (48, 16), mapping),
        r"shard_sizes \(40, 16, 16\) against y.s 80 columns": (y, x, a, b, (40, 16, 16), mapping),
        "input size 40 is not x's 30": (y, x[:, :30], a, b, QKV, mapping),
        "lora_b": (y, x, a, b[:, :, :4], QKV, mapping),
        "dtypes differ": (y, x, a.double(), b, QKV, mapping),
        "x \\[T, K\\]": (y, x[0], a, b, QKV, mapping),
        "slot 3; lora_a has 2 slots": (y, x, a[:2], b[:2], QKV, LoRAMapping.build([3, 0, 1], NUM_SLOTS, CPU)),
        "the mapping is over 4 slots; lora_a has 2": (y, x, a[:2], b[:2], QKV, LoRAMapping.build([0, 1, 1], NUM_SLOTS, CPU)),
        "the mapping is over 4 slots; lora_a has 3": (y, x, a[:3], b[:3], QKV, LoRAMapping.static(3, NUM_SLOTS, CPU)),
    }


@pytest.mark.parametrize("message", list(mismatched_cases()))
@pytest.mark.parametrize("op", [add_lora, add_lora_reference])
def test_mismatched_arguments_raise_clear_errors(op, message):
    with pytest.raises(ValueError, match=message):
        op(*mismatched_cases()[message])


@pytest.mark.parametrize("pattern", ["one-token", "interleaved", "segments"])
def test_strided_rows(cpu_path, pattern):
    """x and y as column slices of wider tensors (row strides above their widths)."""
    slots = SLOT_PATTERNS[pattern]
    y, x, a, b = operands(slots)
    wide_x, wide_y = torch.zeros(len(slots), 50), torch.zeros(len(slots), 90)
    wide_x[:, 3:43], wide_y[:, 5:85] = x, y
    expected = y.clone()
    add_lora_reference(expected, x, a, b, QKV, LoRAMapping.build(slots, NUM_SLOTS, CPU))
    add_lora(wide_y[:, 5:85], wide_x[:, 3:43], a, b, QKV, LoRAMapping.build(slots, NUM_SLOTS, CPU))
    torch.testing.assert_close(wide_y[:, 5:85], expected, atol=1e-5, rtol=1e-5)
    assert not wide_y[:, :5].any() and not wide_y[:, 85:].any()
