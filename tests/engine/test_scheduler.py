from gdserve.engine.kv_cache_manager import KVCacheManager
from gdserve.engine.request import SequenceStatus
from gdserve.engine.scheduler import Scheduler
from tests.engine.helpers import fake_step, make_seq


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, max_loras=0):
    return Scheduler(KVCacheManager(num_blocks, block_size), max_num_seqs, budget, max_loras)


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
