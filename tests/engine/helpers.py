"""Engine-free drivers for the scheduler and the KV cache manager."""
from gdserve.engine.request import Sequence
from gdserve.engine.scheduler import ScheduledBatch, Scheduler
from gdserve.lora.request import LoRARequest
from gdserve.sampling_params import SamplingParams


def make_seq(token_ids, request_id="r", max_tokens=8, extra_keys=(), lora_int_id: int = 0) -> Sequence:
    lora = LoRARequest(f"lora{lora_int_id}", lora_int_id, "/adapters") if lora_int_id else None
    return Sequence(request_id, 0, list(token_ids), len(token_ids), SamplingParams(max_tokens=max_tokens),
                    max_tokens, None, None, lora_request=lora, extra_keys=extra_keys)


def fake_step(scheduler: Scheduler, next_token: int = 7) -> ScheduledBatch:
    """Schedule, 'compute' the scheduled tokens, append a token where a sequence caught up,
    and finish sequences at max_tokens: what the engine does, minus the model."""
    batch = scheduler.schedule()
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        seq.num_computed_tokens += n
        scheduler.kv_cache.cache_full_blocks(seq)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(next_token)
            if seq.num_output_tokens >= seq.max_tokens:
                seq.finish_reason = "length"
                scheduler.finish(seq)
    return batch
