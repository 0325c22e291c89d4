import random

import pytest

from gdserve.engine.growth_reserve import GrowthReserve
from gdserve.engine.kv_cache_manager import KVCacheManager
from gdserve.engine.request import Sequence, SequenceStatus
from gdserve.engine.scheduler import Scheduler
from tests.engine.helpers import fake_step, make_seq


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, max_loras=0, num_swap_blocks=0,
                   conservativeness=0.0):
    """conservativeness 0: no growth reserve (the preemption tests overcommit the cache)."""
    mode = "swap" if num_swap_blocks else "recompute"
    return Scheduler(KVCacheManager(num_blocks, block_size, num_swap_blocks=num_swap_blocks), max_num_seqs,
                     budget, max_loras, mode, GrowthReserve(conservativeness))


def assert_all_free(s: Scheduler) -> None:
    kv = s.kv_cache
    assert kv.num_free_blocks == kv.num_blocks and all(b.ref_cnt == 0 for b in kv.pool.blocks)
    assert kv.swap_space.num_free_blocks == kv.swap_space.num_blocks


def test_token_budget_chunks_prefills_and_serves_decodes_first():
    s = make_scheduler(budget=40)
    a, b = make_seq(range(30), "a"), make_seq(range(100, 130), "b")
    s.add(a)
    s.add(b)
    batch = fake_step(s)
    assert [(q.request_id, n) for q, n in zip(batch.seqs, batch.num_new_tokens)] == [("a", 30), ("b", 10)]
    batch = fake_step(s)
    # a decodes one token; b's prefill continues with what is left of the budget.
    assert [(q.request_id, n) for q, n in zip(batch.seqs, batch.num_new_tokens)] == [("a", 1), ("b", 20)]
    assert b.num_output_tokens == 1 and a.num_output_tokens == 2


def test_max_num_seqs_caps_the_running_batch():
    s = make_scheduler(max_num_seqs=2)
    seqs = [make_seq(range(5), str(i)) for i in range(4)]
    for q in seqs:
        s.add(q)
    batch = fake_step(s)
    assert len(batch.seqs) == 2 and len(s.waiting) == 2


def test_requests_join_and_leave_between_steps():
    s = make_scheduler()
    a = make_seq(range(5), "a", max_tokens=2)
    s.add(a)
    fake_step(s)
    b = make_seq(range(5), "b", max_tokens=3)
    s.add(b)
    batch = fake_step(s)
    assert {q.request_id for q in batch.seqs} == {"a", "b"}
    assert a.is_finished and not b.is_finished
    while s.has_unfinished():
        fake_step(s)
    assert s.kv_cache.num_free_blocks == s.kv_cache.num_blocks


def test_preempts_newest_when_blocks_run_out_and_recomputes():
    # 6 blocks of 4 tokens; three sequences of 7 tokens each growing by one token a step.
    s = make_scheduler(num_blocks=6, block_size=4)
    seqs = [make_seq(range(i * 10, i * 10 + 7), str(i), max_tokens=8) for i in range(3)]
    for q in seqs:
        s.add(q)
    fake_step(s)
    assert all(q.status == SequenceStatus.RUNNING for q in seqs)
    preempted = 0
    while s.has_unfinished():
        batch = fake_step(s)
        preempted += batch.num_preempted
    assert preempted > 0 and seqs[2].num_preemptions > 0 and seqs[0].num_preemptions == 0
    assert all(q.num_output_tokens == 8 for q in seqs)
    assert s.kv_cache.num_free_blocks == 6


def test_preempted_sequence_goes_to_the_head_of_the_queue():
    s = make_scheduler(num_blocks=4, block_size=4, budget=64)
    a, b = make_seq(range(8), "a", max_tokens=20), make_seq(range(20, 27), "b", max_tokens=20)
    late = make_seq(range(40, 43), "late")
    for q in (a, b):
        s.add(q)
    fake_step(s)                 # a: 2 blocks (+1 token), b: 2 blocks
    s.add(late)
    batch = fake_step(s)         # a needs a third block: b (newest) is preempted
    assert batch.num_preempted == 1 and list(s.waiting) == [b, late]
    assert b.num_computed_tokens == 0 and b.block_table == []


def test_finish_from_waiting_frees_nothing_twice():
    s = make_scheduler()
    a = make_seq(range(5))
    s.add(a)
    s.finish(a)
    assert not s.has_unfinished() and s.kv_cache.num_free_blocks == s.kv_cache.num_blocks


def test_max_loras_holds_back_a_new_adapter_but_not_those_behind_it():
    s = make_scheduler(max_loras=2)
    seqs = [make_seq(range(5), "a", lora_int_id=1), make_seq(range(5), "b", lora_int_id=2),
            make_seq(range(5), "c", lora_int_id=3), make_seq(range(5), "d", lora_int_id=1),
            make_seq(range(5), "e")]
    for q in seqs:
        s.add(q)
    batch = fake_step(s)
    assert [q.request_id for q in batch.seqs] == ["a", "b", "d", "e"]
    assert [q.request_id for q in s.waiting] == ["c"]
    while s.has_unfinished():
        fake_step(s)
    assert seqs[2].is_finished  # admitted once the other adapters' sequences were done



def run_to_end(s: Scheduler) -> list:
    batches = []
    while s.has_unfinished():
        batches.append(fake_step(s))
    return batches


def two_growing(num_swap_blocks: int) -> tuple[Scheduler, Sequence, Sequence]:
    """Four blocks of 4 tokens, after one step: a holds 2 (+1 token) and b 2 (8 tokens now), so
    the next step preempts b, the newest, for a's third block."""
    s = make_scheduler(num_blocks=4, block_size=4, num_swap_blocks=num_swap_blocks)
    a, b = make_seq(range(8), "a", max_tokens=6), make_seq(range(20, 27), "b", max_tokens=6)
    for q in (a, b):
        s.add(q)
    fake_step(s)
    return s, a, b


def test_swap_preemption_keeps_computed_tokens_and_copies_blocks_out_and_back():
    s, a, b = two_growing(num_swap_blocks=8)
    b_blocks = list(b.block_table)
    batch = fake_step(s)              # a needs a third block: b (newest) is swapped out
    assert batch.preempted == [b] and batch.swapped_out == [b] and b.status == SequenceStatus.SWAPPED
    assert list(s.swapped) == [b] and not s.waiting and b.num_computed_tokens == 7
    assert [d for d, _ in batch.blocks_to_swap_out] == b_blocks
    cpu_blocks = [c for _, c in batch.blocks_to_swap_out]
    assert sorted(b.swapped_blocks.values()) == sorted(cpu_blocks) and set(b.block_table) == {-1}
    batches = run_to_end(s)
    swap_ins = [p for batch in batches for p in batch.blocks_to_swap_in]
    assert sorted(c for c, _ in swap_ins) == sorted(cpu_blocks)
    first_back = next(batch for batch in batches if batch.blocks_to_swap_in)
    assert b in first_back.seqs  # scheduled in the step that brings it back
    assert a.num_output_tokens == b.num_output_tokens == 6 and s.num_swap_outs >= 1
    assert_all_free(s)


def test_swapped_sequences_come_back_before_new_ones_are_admitted():
    s, a, b = two_growing(num_swap_blocks=8)
    late = make_seq(range(40, 43), "late", max_tokens=2)
    s.add(late)
    fake_step(s)                      # b swapped out; late may not jump ahead of it
    while b.status == SequenceStatus.SWAPPED:
        fake_step(s)
        assert late.status == SequenceStatus.WAITING or b.status != SequenceStatus.SWAPPED
    run_to_end(s)
    assert all(q.is_finished for q in (a, b, late))
    assert_all_free(s)


def test_a_full_swap_space_falls_back_to_recompute():
    s, a, b = two_growing(num_swap_blocks=1)
    batch = fake_step(s)              # b holds 2 blocks, the swap space 1: recompute
    assert batch.preempted == [b] and batch.swapped_out == [] and not batch.blocks_to_swap_out
    assert list(s.waiting) == [b] and b.num_computed_tokens == 0 and s.num_swap_outs == 0
    run_to_end(s)
    assert_all_free(s)


def test_blocks_shared_with_a_running_sequence_stay_on_the_device():
    s = make_scheduler(num_blocks=6, block_size=4, num_swap_blocks=8)
    prefix = list(range(8))
    a, b = make_seq(prefix + [50], "a", max_tokens=12), make_seq(prefix + [60], "b", max_tokens=12)
    s.add(a)
    fake_step(s)                      # a's two prefix blocks are cached
    s.add(b)
    fake_step(s)                      # b takes them from the prefix cache
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared
    while not s.swapped and s.has_unfinished():
        batch = fake_step(s)
    assert s.swapped and s.swapped[0] is b
    assert b.block_table[:2] == shared and all(d not in shared for d, _ in batch.blocks_to_swap_out)
    assert all(s.kv_cache.pool.blocks[d].ref_cnt == 2 for d in shared)
    run_to_end(s)
    assert a.num_output_tokens == b.num_output_tokens == 12
    assert_all_free(s)


def test_swapped_sequences_holding_shared_blocks_never_stall():
    """h is swapped out last, while s1 and s2 (swapped before it) hold their shared prefix block:
    with nothing running, h cannot come back until the newest swapped sequences give it up."""
    s = make_scheduler(num_blocks=5, block_size=4, num_swap_blocks=16)
    h = make_seq(range(100, 106), "h", max_tokens=12)
    s1, s2 = make_seq([1, 2, 3, 4, 50], "s1", max_tokens=12), make_seq([1, 2, 3, 4, 60], "s2", max_tokens=12)
    s.add(h)
    s.add(s1)
    fake_step(s)
    s.add(s2)                                  # shares s1's cached prefix block
    while h.status != SequenceStatus.SWAPPED:
        fake_step(s)
    assert list(s.swapped) == [h, s1, s2] and not s.running
    batch = fake_step(s)
    assert batch.seqs == [h] and list(s.waiting) == [s1, s2] and s1.num_computed_tokens == 0
    run_to_end(s)
    assert all(q.num_output_tokens == 12 for q in (h, s1, s2))
    assert_all_free(s)


@pytest.mark.parametrize("seed", range(40))
def test_swapping_with_shared_prefixes_always_finishes_and_frees_everything(seed):
    """Sequences sharing prefix blocks, a cache too small for them, arrivals over time: swapped
    sequences can end up holding shared blocks with nothing running, which must never stall."""
    rng = random.Random(seed)
    block_size = 4
    s = make_scheduler(num_blocks=rng.randint(6, 10), block_size=block_size, num_swap_blocks=rng.randint(1, 12),
                       max_num_seqs=rng.randint(2, 6), budget=rng.choice([8, 64]))
    prefixes = [[rng.randrange(1000) for _ in range(block_size * rng.randint(1, 2))] for _ in range(2)]
    arrivals = [(rng.randint(0, 6), make_seq(rng.choice(prefixes) + [rng.randrange(1000)], str(i),
                                             max_tokens=rng.randint(2, 12))) for i in range(6)]
    for step in range(500):
        for when, seq in arrivals:
            if when == step:
                s.add(seq)
        if step > 6 and not s.has_unfinished():
            break
        fake_step(s)
    assert all(seq.num_output_tokens == seq.max_tokens for _, seq in arrivals)
    assert_all_free(s)


def test_finishing_a_swapped_sequence_frees_its_swap_blocks():
    s, a, b = two_growing(num_swap_blocks=8)
    fake_step(s)
    assert b.status == SequenceStatus.SWAPPED
    s.finish(b)
    assert not s.swapped and s.kv_cache.swap_space.num_free_blocks == 8
    run_to_end(s)
    assert_all_free(s)


def test_swap_in_takes_blocks_still_in_the_prefix_cache_without_copying():
    s, a, b = two_growing(num_swap_blocks=8)
    batch = fake_step(s)
    full = b.swapped_blocks[0]                 # b's first block was full: still cached when freed
    s.finish(a)                                # room again, and nothing evicted b's cached block
    batch = fake_step(s)
    assert b in batch.seqs and full not in [c for c, _ in batch.blocks_to_swap_in]
    run_to_end(s)
    assert_all_free(s)
