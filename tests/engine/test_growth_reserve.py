import pytest

from gdserve.engine.growth_reserve import INITIAL_RATIO, GrowthReserve
from gdserve.engine.kv_cache_manager import KVCacheManager
from gdserve.engine.scheduler import Scheduler
from tests.engine.helpers import fake_step, make_seq


def finished(num_output: int, max_tokens: int):
    seq = make_seq(range(4), max_tokens=max_tokens)
    seq.token_ids += [7] * num_output
    return seq


def test_ratio_starts_at_no_reserve_and_learns_from_finished_sequences():
    reserve = GrowthReserve()
    assert reserve.ratio == INITIAL_RATIO == 0
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
    # the first wave overcommits as it would without the reserve; once sequences have finished
    # (at max_tokens: ratio 1) nothing is preempted
    assert all(seq.num_preemptions == 0 for seq in reserved_seqs[16:])
    assert all(seq.num_output_tokens == 24 for seq in reserved_seqs)


def test_a_learned_ratio_holds_back_what_would_not_fit_and_early_stops_widen_the_batch():
    s = scheduler(1.0, num_blocks=64, max_num_seqs=16)
    for _ in range(8):
        s.growth_reserve.record(finished(56, 56))  # earlier requests ran to max_tokens
    # each needs 8 + 56 tokens = 16 blocks by its end: 4 fit the 64 blocks at a time
    long_runs = [make_seq(range(i * 10, i * 10 + 8), f"long{i}", max_tokens=56) for i in range(8)]
    preempted, widest = run(s, long_runs)
    assert (preempted, widest) == (0, 4)
    # requests that stop after 2 of their 56 tokens bring the ratio down, and the batch fills
    short_runs = [make_seq(range(i * 10, i * 10 + 8), f"short{i}", max_tokens=56) for i in range(200)]
    preempted, widest = run(s, short_runs, stop_at=2)
    assert preempted == 0 and widest == 16
    assert s.growth_reserve.ratio < 0.15


def test_aborted_sequences_teach_nothing():
    s = scheduler(1.0)
    s.growth_reserve.record(finished(50, 100))
    seq = make_seq(range(8), max_tokens=100)
    s.add(seq)
    fake_step(s)
    seq.finish_reason = "abort"
    s.finish(seq)
    assert s.growth_reserve.ratio == pytest.approx(0.5)


def test_sequences_that_each_need_the_whole_cache_run_one_at_a_time_without_preemption():
    # 8 blocks of 4: each sequence (5 + 27 tokens) fills the cache by its last token
    s = scheduler(1.0, num_blocks=8)
    s.growth_reserve.record(finished(27, 27))
    seqs = [make_seq(range(i * 10, i * 10 + 5), str(i), max_tokens=27) for i in range(3)]
    assert run(s, seqs) == (0, 1)
    assert all(seq.num_output_tokens == 27 for seq in seqs)


def test_the_engine_teaches_the_reserve_what_its_requests_generate(tiny_llama_dir):
    from gdserve import LLM, SamplingParams
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, block_size=4)
    reserve = llm.engine.scheduler.growth_reserve
    prompts = [{"prompt_token_ids": [5 + i, 6, 7]} for i in range(4)]
    llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert reserve.ratio == 1.0  # every request ran to its max_tokens
    llm.generate(prompts, SamplingParams(max_tokens=12, stop_token_ids=list(range(259))), use_tqdm=False)
    assert reserve.ratio == pytest.approx((4 * 12 + 4 * 1) / (8 * 12))  # then each stopped at its first token
    request_id = llm.engine.add_request([5, 6, 7], SamplingParams(max_tokens=12, ignore_eos=True))
    llm.engine.step()
    llm.engine.abort_request(request_id)
    assert reserve.ratio == pytest.approx((4 * 12 + 4 * 1) / (8 * 12))  # an abort teaches nothing
