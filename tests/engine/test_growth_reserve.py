import pytest

from gdserve.engine.growth_reserve import INITIAL_RATIO, GrowthReserve
from gdserve.engine.kv_cache_manager import KVCacheManager
from gdserve.engine.scheduler import Scheduler
from tests.engine.helpers import fake_step, make_seq


def finished(num_output: int, max_tokens: int):
    seq = make_seq(range(4), max_tokens=max_tokens)
    seq.token_ids += [7] * num_output
    return seq


def test_ratio_starts_at_the_initial_guess_and_learns_from_finished_sequences():
    reserve = GrowthReserve()
    assert reserve.ratio == INITIAL_RATIO
    reserve.record(finished(10, 100))
    reserve.record(finished(30, 100))
    assert reserve.ratio == pytest.approx(0.2)


def test_ratio_forgets_what_falls_out_of_the_window():
    reserve = GrowthReserve(window=2)
    reserve.record(finished(100, 100))
    reserve.record(finished(0, 100))
    reserve.record(finished(50, 100))
    assert reserve.ratio == pytest.approx(0.25)


def test_conservativeness_scales_the_ratio_up_to_one_and_zero_turns_it_off():
    for c, expected in [(0.0, 0.0), (0.5, 0.25), (4.0, 1.0)]:
        reserve = GrowthReserve(conservativeness=c)
        reserve.record(finished(50, 100))
        assert reserve.ratio == pytest.approx(expected)
    with pytest.raises(ValueError, match="schedule_conservativeness must be >= 0"):
        GrowthReserve(conservativeness=-1)


def test_expected_tokens_count_the_unallocated_prompt_and_the_expected_outputs():
    reserve = GrowthReserve()
    reserve.record(finished(25, 100))
    seq = make_seq(range(40), max_tokens=100)
    assert reserve.expected_tokens(seq, num_slots=16) == pytest.approx(24 + 25)
    seq.token_ids += [7] * 60  # 40 outputs left to go
    assert reserve.expected_tokens(seq, num_slots=100) == pytest.approx(10)
    assert reserve.expected_tokens(seq, num_slots=120) == 0
    assert reserve.reserved_tokens([seq], block_size=4) == pytest.approx(100 + 10)  # no blocks yet


def run(scheduler: Scheduler, seqs, stop_at: int | None = None) -> tuple[int, int]:
    """Drive seqs to the end, each stopping (finish reason "stop") after stop_at outputs if
    given. Returns the preemptions and the widest running batch."""
    for seq in seqs:
        scheduler.add(seq)
    preempted = widest = 0
    for _ in range(10_000):
        if not scheduler.has_unfinished():
            break
        batch = fake_step(scheduler)
        preempted += batch.num_preempted
        widest = max(widest, len(scheduler.running))
        for seq in list(scheduler.running):
            if stop_at is not None and seq.num_output_tokens >= stop_at:
                seq.finish_reason = "stop"
                scheduler.finish(seq)
    assert not scheduler.has_unfinished()
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks
    return preempted, widest


def scheduler(conservativeness: float, num_blocks=64, max_num_seqs=16) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, 4), max_num_seqs, 256, 0, "recompute", GrowthReserve(conservativeness))


def test_sequences_that_run_to_max_tokens_stop_being_preempted_once_the_ratio_is_learned():
    def workload():
        return [make_seq(range(i * 100, i * 100 + 8), str(i), max_tokens=24) for i in range(40)]

    overcommitted, _ = run(scheduler(0.0), workload())
    reserved_seqs = workload()
    reserved, _ = run(scheduler(1.0), reserved_seqs)
    assert overcommitted > 0
    assert reserved < overcommitted / 2
    # after the first wave (whose guess was INITIAL_RATIO) nothing is preempted
    assert all(seq.num_preemptions == 0 for seq in reserved_seqs[16:])
    assert all(seq.num_output_tokens == 24 for seq in reserved_seqs)


def test_sequences_that_stop_early_keep_the_batch_full():
    s = scheduler(1.0, num_blocks=256, max_num_seqs=16)
    # max_tokens would fill the cache many times over, but each stops after 4 tokens
    seqs = [make_seq(range(i * 10, i * 10 + 8), str(i), max_tokens=400) for i in range(64)]
    _, widest = run(s, seqs, stop_at=4)
    assert s.growth_reserve.ratio == pytest.approx(4 / 400)
    assert widest == 16


def test_aborted_sequences_teach_nothing():
    s = scheduler(1.0)
    seq = make_seq(range(8), max_tokens=100)
    s.add(seq)
    fake_step(s)
    seq.finish_reason = "abort"
    s.finish(seq)
    assert s.growth_reserve.ratio == INITIAL_RATIO


def test_sequences_that_each_need_the_whole_cache_run_one_at_a_time_without_preemption():
    # 8 blocks of 4: each sequence (5 + 27 tokens) fills the cache by its last token
    s = scheduler(4.0, num_blocks=8)
    seqs = [make_seq(range(i * 10, i * 10 + 5), str(i), max_tokens=27) for i in range(3)]
    assert run(s, seqs) == (0, 1)
    assert all(seq.num_output_tokens == 27 for seq in seqs)
