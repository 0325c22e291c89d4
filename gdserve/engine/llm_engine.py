"""The engine core: admit requests, step the batch, sample, detokenize, finish.

Failures are contained where they belong. An exception in one request's share of a step (creating
or advancing its grammar matcher, detokenizing, stop checks, logprobs) finishes that request alone
with an error; one in the batch's shared work (the forward, the sampler, the copy to the host)
finishes the requests of that step with an error. Either way their blocks are freed, the error is
in their RequestOutput, and the engine goes on with the other requests and new ones.
"""
import itertools
import logging
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from gdserve.config import MAX_DEFAULT_SEQS, EngineConfig, default_max_num_seqs
from gdserve.engine.detokenizer import IncrementalDetokenizer
from gdserve.engine.errors import EngineDeadError
from gdserve.engine.executor import MultiprocExecutor
from gdserve.engine.forward_clock import ForwardClock
from gdserve.engine.guided import GuidedDecoder, check_fits
from gdserve.engine.growth_reserve import GrowthReserve
from gdserve.engine.kv_cache_manager import KVCacheManager
from gdserve.engine.model_runner import ModelRunner, dummy_step_blocks, kv_cache_bytes_per_block
from gdserve.engine.request import PLACEHOLDER, Sequence
from gdserve.engine.sampler import HostSamplerOutput, Sampler, SamplingBatch
from gdserve.engine.scheduler import ScheduledBatch, Scheduler
from gdserve.engine.worker import load_shard
from gdserve.grammar import Grammar
from gdserve.grammar.matcher_pool import ACCEPTED, REFUSED, TERMINATED
from gdserve.lora.adapter import LoRALoadError
from gdserve.lora.layers import LoRAContext, wrap_lora_layers
from gdserve.lora.manager import LoRAManager
from gdserve.lora.request import LoRARequest
from gdserve.models.loader import load_eos_token_ids, load_tokenizer, resolve_model
from gdserve.outputs import CompletionOutput, RequestOutput
from gdserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

MAX_SWAP_SHARE = 0.7  # of the machine's memory that swap_space may take


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load, for /metrics and admission control."""
    num_running: int            # sequences scheduled in the running batch
    num_waiting: int            # sequences queued, plus requests whose grammar is compiling
    num_blocks: int
    num_used_blocks: int        # KV blocks held by sequences (cached free blocks don't count)
    prefix_cache_queries: int   # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int      # of those, tokens found
    num_preemptions: int
    num_swapped: int = 0        # sequences swapped out to CPU memory now
    num_swap_blocks: int = 0    # swap space, in KV blocks (0: preemption recomputes)
    num_used_swap_blocks: int = 0

    @property
    def kv_cache_usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def cpu_cache_usage(self) -> float:
        return self.num_used_swap_blocks / self.num_swap_blocks if self.num_swap_blocks else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


@dataclass
class PendingSample:
    """A step's sampled tokens: on the device, where the next step's inputs read them, and on
    their way to the host, where the engine takes them in during the next step."""
    seqs: list[Sequence]
    token_ids: torch.Tensor      # [N] on the device
    host: HostSamplerOutput


class LLMEngine:
    def __init__(self, config: EngineConfig):
        # Tensor parallelism: this process is rank 0 and runs its shard; the executor starts the
        # other ranks, which load theirs meanwhile, and runs every ModelRunner call on all of them.
        self.executor = MultiprocExecutor(config) if config.tensor_parallel_size > 1 else None
        try:
            self._init(config)
        except BaseException:
            self.close()
            raise

    def _init(self, config: EngineConfig) -> None:
        self.config = config
        self.device, self.dtype = config.torch_device(), config.torch_dtype()
        self.kv_cache_dtype = config.torch_kv_cache_dtype()
        self.guided: GuidedDecoder | None = None
        path = resolve_model(config.model)
        self.model, self.model_config = load_shard(config, self.device)
        self.lora, lora_context = None, None
        if config.enable_lora:
            lora_context, layers = wrap_lora_layers(self.model, config.max_loras, config.max_lora_rank,
                                                    self.dtype, self.device)
            self.model.fuse_activation_quant()
            self.lora = LoRAManager(self.model, layers, config.max_loras, config.max_cpu_loras,
                                    config.max_lora_rank, self.dtype)
        self.tokenizer = load_tokenizer(resolve_model(config.tokenizer) if config.tokenizer else path)
        self.eos_token_ids = load_eos_token_ids(path, self.tokenizer)
        self.guided = GuidedDecoder(self.tokenizer, self.eos_token_ids, self.model_config.vocab_size,
                                    config.grammar_compile_timeout_s, config.grammar_compile_workers,
                                    config.grammar_cache_path(), config.grammar_mask_workers,
                                    config.enable_forced_tokens)
        self.guided.start_workers()  # while the KV cache is sized and CUDA graphs are captured
        self.forward_clock = ForwardClock.of(self.device)
        self._cpu_threads = torch.get_num_threads() if self._shares_cores() else None
        self.max_model_len = self._max_model_len()
        num_blocks = self._num_kv_blocks()
        if config.max_num_seqs is None:
            config.max_num_seqs = default_max_num_seqs(num_blocks * config.block_size, config.max_num_batched_tokens)
        self.runner = self._new_runner(num_blocks, lora_context)
        if self.device.type == "cuda" and not config.enforce_eager:
            self.runner.capture_cuda_graphs(config.max_num_seqs, self.max_model_len)
        if self.device.type == "cuda":
            self.runner.warm_up(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        preemption_mode = config.preemption_mode or "recompute"
        num_swap_blocks = self._num_swap_blocks() if preemption_mode == "swap" else 0
        self.runner.allocate_swap_space(num_swap_blocks)
        self.kv_cache = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching, num_swap_blocks)
        self.scheduler = Scheduler(self.kv_cache, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_loras if config.enable_lora else 0, preemption_mode,
                                   GrowthReserve(config.schedule_conservativeness))
        self.sampler = Sampler()
        # Overlap each step's host work with the device's forward (where the forward is asynchronous).
        self.async_scheduling = (config.async_scheduling if config.async_scheduling is not None
                                 else self.device.type == "cuda")
        self._pending: PendingSample | None = None
        self.num_forward_steps = 0  # steps that ran the model (the benches count them)
        self.requests: dict[str, list[Sequence]] = {}
        self.prompts: dict[str, str | None] = {}
        self.errors: dict[str, str] = {}
        self.compiling: dict[str, Future[Grammar]] = {}  # guided requests waiting for their grammar
        self._unreported: list[str] = []  # requests failed (or finished at admission) since the last step returned
        self._ids = itertools.count()

    # ---- admission -------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, prompt: str | None = None,
                    grammar: Grammar | None = None, lora_request: LoRARequest | None = None) -> str:
        """Queue a request. A guided one whose compiled `grammar` is not given compiles in the
        background while the engine keeps stepping; a compile error finishes it with an error.
        A lora_request's adapter is read now if it is not already (a LoRALoadError if it can't be)."""
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        max_tokens = self._check_prompt(prompt_token_ids, params)
        if grammar is not None:
            check_fits(grammar, max_tokens)
        if lora_request is not None:
            self.add_lora(lora_request)
        seqs = [self._new_sequence(request_id, i, prompt_token_ids, params, max_tokens, lora_request)
                for i in range(params.best_of)]
        if self.config.enable_prefix_caching:
            for sibling in seqs[1:]:
                sibling.leader = seqs[0]
        self.requests[request_id] = seqs
        self.prompts[request_id] = prompt
        if params.structured_outputs is not None and grammar is None:
            self.compiling[request_id] = self.guided.submit(params.structured_outputs)
        else:
            self._schedule(request_id, grammar)
        return request_id

    def _schedule(self, request_id: str, grammar: Grammar | None) -> None:
        """Queue the request's sequences, each past the forced text at its constraint's start
        (a sequence that this finishes, by a stop string or max_tokens, is reported by the next
        step)."""
        with self._guard(request_id, "creating its grammar matcher"):
            for seq in self.requests[request_id]:
                if grammar is None:
                    self.scheduler.add(seq)
                    continue
                seq.matcher, forced = self.guided.new_matcher(grammar, seq)
                self._append_forced(seq, forced, ACCEPTED)
                if seq.is_finished:
                    self._unreported.append(request_id)
                else:
                    self.scheduler.add(seq)

    def _admit_compiled(self) -> None:
        """Schedule the requests whose grammar is ready; fail those whose compile failed."""
        for request_id, future in list(self.compiling.items()):
            if not future.done():
                continue
            del self.compiling[request_id]
            try:
                grammar = future.result()
                check_fits(grammar, self.requests[request_id][0].max_tokens)
            except Exception as e:  # noqa: BLE001 (a failed compile, or a max_tokens too small for it)
                self._fail(request_id, str(e))
            else:
                self._schedule(request_id, grammar)

    def _check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Validate the prompt against the model and the cache; return the resolved max_tokens."""
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise ValueError("prompt is empty: at least one token is needed")
        vocab = self.model_config.vocab_size
        for what, ids in (("prompt token ids", prompt_token_ids), ("stop_token_ids", params.stop_token_ids),
                          ("logit_bias token ids", params.logit_bias or ())):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{what} {bad[:5]} are outside the vocabulary [0, {vocab})")
        if num_prompt >= self.max_model_len:
            raise ValueError(f"prompt has {num_prompt} tokens; max_model_len is {self.max_model_len}, "
                             "which must leave room for at least one generated token")
        max_tokens = params.max_tokens or self.max_model_len - num_prompt
        if num_prompt + max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens {max_tokens} + prompt {num_prompt} tokens exceeds "
                             f"max_model_len {self.max_model_len}")
        capacity = self.kv_cache.num_blocks * self.config.block_size
        if num_prompt + max_tokens > capacity:
            raise ValueError(f"request needs {num_prompt + max_tokens} KV cache slots but the cache "
                             f"holds {capacity}; raise kv_cache_memory or lower max_tokens")
        return max_tokens

    def _new_sequence(self, request_id: str, index: int, prompt_token_ids: list[int],
                      params: SamplingParams, max_tokens: int, lora_request: LoRARequest | None) -> Sequence:
        generator = None
        if params.seed is not None:
            generator = torch.Generator(self.device).manual_seed(params.seed + index)
        detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                             params.stop or [], params.include_stop_str_in_output,
                                             deferred=params.output_kind == "final_only")
        return Sequence(request_id, index, list(prompt_token_ids), len(prompt_token_ids), params,
                        max_tokens, detokenizer, generator, lora_request=lora_request,
                        extra_keys=(lora_request.lora_int_id,) if lora_request is not None else ())

    # ---- LoRA adapters ---------------------------------------------------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read an adapter into CPU memory (False: it already was). LoRALoadError names what is
        wrong with its directory."""
        return self._lora_manager().add(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self._lora_manager().remove(lora_int_id)

    def list_loras(self) -> set[int]:
        return self._lora_manager().list()

    def _lora_manager(self) -> LoRAManager:
        if self.lora is None:
            raise ValueError("LoRA adapters need an engine started with enable_lora=True (--enable-lora)")
        return self.lora

    def _lora_slots(self, batch: ScheduledBatch) -> list[int] | None:
        """Each scheduled sequence's adapter slot (-1: none), its adapter copied in if needed. A
        sequence whose adapter can no longer be read (its directory changed since) fails and
        leaves the batch."""
        if self.lora is None:
            return None
        requests = {s.lora_int_id: s.lora_request for s in batch.seqs if s.lora_request is not None}
        for lora_int_id, request in list(requests.items()):
            try:
                self.lora.add(request)  # read back from disk if it has left the CPU cache
            except LoRALoadError as e:
                del requests[lora_int_id]
                for seq in [s for s in batch.seqs if s.lora_int_id == lora_int_id]:
                    if seq.request_id in self.requests and not seq.is_finished:
                        self._fail(seq.request_id, str(e))
                keep = [i for i, s in enumerate(batch.seqs) if s.lora_int_id != lora_int_id]
                batch.seqs = [batch.seqs[i] for i in keep]
                batch.num_new_tokens = [batch.num_new_tokens[i] for i in keep]
        slots = self.lora.activate(requests.values())
        return [slots.get(s.lora_int_id, -1) for s in batch.seqs]

    def abort_request(self, request_id: str) -> None:
        self.compiling.pop(request_id, None)
        for seq in self.requests.pop(request_id, []):
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
        self.prompts.pop(request_id, None)
        self.errors.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished() or bool(self.compiling) or self._pending is not None
                or bool(self._unreported))

    def close(self) -> None:
        """Stop the compile workers and the tensor-parallel ranks. Idempotent."""
        if getattr(self, "guided", None) is not None:
            self.guided.close()
        if getattr(self, "_cpu_threads", None) is not None:
            torch.set_num_threads(self._cpu_threads)
        if self.executor is not None:
            self.executor.shutdown()

    def _new_runner(self, num_blocks: int, lora_context: LoRAContext | None = None) -> ModelRunner:
        """A ModelRunner over num_blocks KV blocks: rank 0's, whose calls run on every rank,
        with tensor parallelism."""
        if self.executor is None:
            return ModelRunner(self.model, self.model_config, num_blocks, self.config.block_size,
                               self.device, self.kv_cache_dtype, lora_context)
        return self.executor.init_runner(self.model, self.model_config, num_blocks, self.config.block_size,
                                         self.kv_cache_dtype)

    def stats(self) -> EngineStats:
        kv = self.kv_cache
        return EngineStats(num_running=len(self.scheduler.running),
                           num_waiting=len(self.scheduler.waiting) + len(self.compiling),
                           num_blocks=kv.num_blocks, num_used_blocks=kv.num_blocks - kv.num_free_blocks,
                           prefix_cache_queries=kv.num_queries, prefix_cache_hits=kv.num_hits,
                           num_preemptions=self.scheduler.num_preemptions,
                           num_swapped=len(self.scheduler.swapped), num_swap_blocks=kv.swap_space.num_blocks,
                           num_used_swap_blocks=kv.swap_space.num_blocks - kv.swap_space.num_free_blocks)

    # ---- embeddings ------------------------------------------------------------------------
    def embed(self, prompt_token_ids: list[int]) -> list[float]:
        """The mean-pooled, L2-normalized last hidden state of a prompt. Runs one forward on
        scratch KV blocks taken from the free pool and given back at once (never prefix-cached),
        so call it between steps, on the thread that steps."""
        self._check_prompt(prompt_token_ids, SamplingParams(max_tokens=1))
        num_blocks = -(-len(prompt_token_ids) // self.config.block_size)
        pool = self.kv_cache.pool
        if num_blocks > pool.num_free_blocks:
            raise RuntimeError(f"the KV cache has {pool.num_free_blocks} free blocks, the input needs "
                               f"{num_blocks}: retry when the load is lower")
        blocks = [pool.allocate() for _ in range(num_blocks)]
        try:
            return self.runner.embed(prompt_token_ids, [b.block_id for b in blocks]).tolist()
        finally:
            for block in blocks:
                pool.free(block)

    # ---- the loop --------------------------------------------------------------------------
    @torch.inference_mode()  # the logits are inference tensors: penalties update them in place
    def step(self) -> list[RequestOutput]:
        """Run one batch; return an output for each request that gained a token or finished
        (failed ones included: see the module docstring).

        With async_scheduling a step's sampled tokens stay on the device (the next step's inputs
        read them there) and reach the host during the next step, while the device runs its
        forward: the step returns the outputs of the one before it. A sequence that turns out to
        have finished has had one more row computed, whose token is dropped."""
        start = time.perf_counter()
        self._admit_compiled()
        batch = self.scheduler.schedule()
        # A failed step also fails the sequences it swapped out: their blocks may not have been copied.
        in_flight = batch.seqs + batch.swapped_out + (self._pending.seqs if self._pending is not None else [])
        outputs: list[RequestOutput] = []
        try:
            self._run_batch(batch, outputs, self._lora_slots(batch))
        except Exception as e:
            self._fail_step(in_flight, e)
            if isinstance(e, EngineDeadError):
                raise
        self.guided.end_step(time.perf_counter() - start)
        return outputs + self._take_unreported()

    def _shares_cores(self) -> bool:
        """Whether the forward's threads share the machine's cores with the compile workers: a
        single-process engine on the CPU (a GPU's forward leaves the cores to them)."""
        return self.device.type == "cpu" and self.config.tensor_parallel_size == 1

    def _leave_cores_to_compiles(self) -> None:
        """On the CPU, run the forward on one thread fewer per busy compile worker (at least
        one): a torch thread whose core a worker holds stalls every parallel region of the step
        (steps several times slower, not a core's worth)."""
        if self._cpu_threads is None:
            return
        threads = max(1, self._cpu_threads - self.guided.busy_workers)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def _run_batch(self, batch: ScheduledBatch, outputs: list[RequestOutput], lora_slots: list[int] | None) -> None:
        """Run the batch, adding to outputs as they come: a failure keeps those before it."""
        if batch.blocks_to_swap_out:
            self.runner.swap_out(batch.blocks_to_swap_out)
        if batch.blocks_to_swap_in:
            self.runner.swap_in(batch.blocks_to_swap_in)
        if batch.is_empty:
            outputs += self._take_pending()
            if self.compiling and not self._unreported and not outputs:  # nothing to run until a grammar is ready
                wait(self.compiling.values(), timeout=0.05, return_when=FIRST_COMPLETED)
            return
        sample_rows = [i for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens))
                       if seq.num_computed_tokens + n == seq.num_tokens]
        pending_token_ids = self._pending.token_ids if self._pending is not None else None
        self._leave_cores_to_compiles()
        self.num_forward_steps += 1
        self.forward_clock.start()
        logits = self.runner.execute(batch.seqs, batch.num_new_tokens, sample_rows, pending_token_ids, lora_slots)
        self.forward_clock.stop()
        self.guided.begin_step(self.forward_clock.estimate_s)
        outputs += self._take_pending()
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            if not seq.is_finished:
                self.kv_cache.cache_full_blocks(seq)
        sampled = [batch.seqs[i] for i in sample_rows]
        forced = [seq for seq in sampled if seq.num_computed_tokens < seq.num_tokens]
        if forced:  # forced text taken in since the batch was scheduled: the next step prefills it
            sampled, logits = self._leave_out(forced, sampled, logits)
        if sampled:
            parked = self.guided.apply_bitmask(
                logits, sampled, lambda seq: self._guard(seq.request_id, "computing its grammar mask"))
            if parked:
                for seq in parked:  # recomputes its last position (same token, same KV slot) when next scheduled
                    seq.num_computed_tokens -= 1
                sampled, logits = self._leave_out(parked, sampled, logits)
        if sampled:
            self._pending = self._sample(sampled, logits)
            if not self.async_scheduling:
                outputs += self._take_pending()

    @staticmethod
    def _leave_out(skip: list[Sequence], sampled: list[Sequence], logits: torch.Tensor
                   ) -> tuple[list[Sequence], torch.Tensor]:
        """The sampled sequences and their logits rows, less those in skip."""
        skip = set(skip)
        keep = [i for i, seq in enumerate(sampled) if seq not in skip]
        return [sampled[i] for i in keep], logits[torch.tensor(keep, dtype=torch.long, device=logits.device)]

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> PendingSample:
        """Sample every row; a sequence still running holds a PLACEHOLDER for its token."""
        stop_ids_until_min = [self._min_tokens_stop_ids(s) for s in seqs]
        batch = SamplingBatch.build([s.params for s in seqs], [s.token_ids for s in seqs],
                                    [s.num_prompt_tokens for s in seqs],
                                    [s.generator for s in seqs], stop_ids_until_min,
                                    logits.shape[-1], logits.device)
        out = self.sampler(logits, batch)
        for row, seq in enumerate(seqs):
            if not seq.is_finished:
                seq.token_ids.append(PLACEHOLDER)
                seq.pending_row = row
        return PendingSample(seqs, out.token_ids, out.to_host())

    def _take_pending(self) -> list[RequestOutput]:
        """Wait for the last sampled tokens to reach the host and take them in."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        token_ids, logprobs, top = pending.host.wait()
        guided = [(seq, t) for seq, t in zip(pending.seqs, token_ids) if seq.matcher is not None and not seq.is_finished]
        verdicts = dict(zip([seq for seq, _ in guided], self.guided.advance(guided))) if guided else {}
        taken = []
        for row, (seq, token_id) in enumerate(zip(pending.seqs, token_ids)):
            if seq.is_finished:  # before its row was sampled, or aborted since: the token is dropped
                if seq.token_ids[-1] == PLACEHOLDER:
                    seq.token_ids.pop()
                continue
            seq.token_ids[-1] = token_id
            verdict, forced = verdicts.get(seq, (None, None))
            try:  # as _guard, without a context manager's cost per token
                if logprobs is not None:
                    self._record_logprobs(seq, token_id, logprobs[row], top, row)
                if forced:
                    self._check_finished(seq, token_id, ACCEPTED)
                    self._append_forced(seq, forced, verdict)
                else:
                    self._check_finished(seq, token_id, verdict)
            except Exception:
                self._request_failed(seq.request_id, "processing its sampled token")
            taken.append(seq)
        return self._collect_outputs(taken)

    def _append_forced(self, seq: Sequence, forced: list[int], verdict: int) -> None:
        """Append the forced tokens that follow seq's sampled one (its matcher is past them;
        verdict: the matcher's after them), each checked as a sampled token is (stop strings,
        max_tokens), until one finishes it. The next step prefills them as a chunk."""
        for k, token_id in enumerate(forced):
            if seq.is_finished:
                return
            seq.token_ids.append(token_id)
            seq.num_forced_tokens += 1
            self._check_finished(seq, token_id, verdict if k == len(forced) - 1 else ACCEPTED)

    def _min_tokens_stop_ids(self, seq: Sequence) -> set[int]:
        # A guided sequence ends when its grammar says so: blocking EOS could leave no token.
        if seq.num_output_tokens >= seq.params.min_tokens or seq.matcher is not None:
            return set()
        return set(self.eos_token_ids) | set(seq.params.stop_token_ids or ())

    def _record_logprobs(self, seq: Sequence, token_id: int, logprob: float, top, row: int) -> None:
        seq.cumulative_logprob += logprob
        if seq.params.logprobs is None:
            return
        entry = {token_id: logprob}
        if top is not None:
            k = seq.params.logprobs
            entry.update((t, lp) for t, lp in zip(top[0][row][:k], top[1][row][:k]) if t not in entry)
        seq.logprobs.append(entry)

    def _check_finished(self, seq: Sequence, token_id: int, verdict: int | Exception | None) -> None:
        """seq has just gained token_id (verdict: its matcher's, GuidedDecoder.advance, for a
        guided one): advance its detokenizer, finish it if due."""
        params = seq.params
        if isinstance(verdict, Exception):
            raise verdict
        if verdict == REFUSED:
            self._fail(seq.request_id, f"token {token_id} was sampled outside the grammar's mask")
            return
        if token_id in self.eos_token_ids and (not params.ignore_eos or seq.matcher is not None):
            self._finish(seq, "stop")
            return
        if params.stop_token_ids and token_id in params.stop_token_ids:
            self._finish(seq, "stop", token_id)
            return
        seq.text += seq.detokenizer.append(token_id)
        if seq.detokenizer.stop_reason is not None:
            self._finish(seq, "stop", seq.detokenizer.stop_reason)
        elif verdict == TERMINATED:
            self._finish(seq, "stop")
        elif seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        seq.text += seq.detokenizer.flush()
        self.scheduler.finish(seq)

    @contextmanager
    def _guard(self, request_id: str, what: str) -> Iterator[None]:
        """One request's share of the step: an exception in it fails that request alone."""
        try:
            yield
        except Exception:
            self._request_failed(request_id, what)

    def _request_failed(self, request_id: str, what: str) -> None:
        """In an exception handler: fail the request whose `what` raised."""
        error = sys.exc_info()[1]
        logger.exception("request %s failed: %s raised", request_id, what)
        self._fail(request_id, f"{what} failed ({type(error).__name__}); the engine log has the details")

    def _fail_step(self, seqs: list[Sequence], error: Exception) -> None:
        """The batch's shared work raised: fail the requests of these sequences (their tokens in
        flight are lost with it)."""
        logger.error("engine step failed: failing the requests of its %d sequences", len(seqs), exc_info=error)
        self._pending = None
        for request_id in dict.fromkeys(seq.request_id for seq in seqs):
            if request_id in self.requests:  # not finished (and reported) before the failure
                self._fail(request_id, f"the engine step failed ({type(error).__name__}); "
                                       "the engine log has the details")

    def _fail(self, request_id: str, error: str) -> None:
        """Finish every sequence of the request with `error` and free its blocks; the step
        reports it. A token still on its way to the host is dropped."""
        self.errors[request_id] = error
        self.compiling.pop(request_id, None)
        for seq in self.requests[request_id]:
            if seq.is_finished:
                continue
            if seq.token_ids[-1] == PLACEHOLDER:
                seq.token_ids.pop()
            if seq.detokenizer.deferred:
                seq.text += seq.detokenizer.flush()
            seq.finish_reason = "error"
            self.scheduler.finish(seq)
        self._unreported.append(request_id)

    def _take_unreported(self) -> list[RequestOutput]:
        """Outputs of the requests failed (or finished at admission) since the last step that no
        other output reported."""
        unreported, self._unreported = self._unreported, []
        return [self._pop_output(r) for r in dict.fromkeys(unreported) if r in self.requests]

    def _collect_outputs(self, seqs: list[Sequence]) -> list[RequestOutput]:
        """Outputs of the requests these sequences belong to; a final_only request's only once
        it has finished."""
        request_ids = dict.fromkeys(s.request_id for s in seqs
                                    if s.is_finished or s.params.output_kind == "cumulative")
        return [self._pop_output(r) for r in request_ids if self._wants_output(r)]

    def _wants_output(self, request_id: str) -> bool:
        """Each step for a cumulative request; once it has finished for a final_only one, and for
        one that ranks best_of > n candidates (known only when every candidate is done)."""
        seqs = self.requests[request_id]
        params = seqs[0].params
        streams = params.output_kind == "cumulative" and params.best_of == params.n
        return streams or all(s.is_finished for s in seqs)

    def _pop_output(self, request_id: str) -> RequestOutput:
        """The request's output; a finished request is forgotten."""
        out = self.request_output(request_id)
        if out.finished:
            del self.requests[request_id], self.prompts[request_id]
            self.errors.pop(request_id, None)
        return out

    def request_output(self, request_id: str) -> RequestOutput:
        """The request's samples; of best_of > n candidates, the n of highest cumulative logprob,
        best first and indexed 0..n-1. Its token count covers every candidate."""
        seqs = self.requests[request_id]
        first = seqs[0]
        params = first.params
        returned = seqs
        if params.best_of > params.n:
            returned = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)[:params.n]
        completions = [CompletionOutput(
            index=i, text=s.text, token_ids=s.output_token_ids, finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
            cumulative_logprob=s.cumulative_logprob if params.sampled_logprobs is not None else None,
            logprobs=s.logprobs if params.logprobs is not None else None,
            num_forced_tokens=s.num_forced_tokens) for i, s in enumerate(returned)]
        return RequestOutput(request_id, self.prompts[request_id], first.token_ids[:first.num_prompt_tokens],
                             completions, finished=all(s.is_finished for s in seqs),
                             num_cached_tokens=first.num_cached_tokens, error=self.errors.get(request_id),
                             num_generated_tokens=sum(s.num_output_tokens for s in seqs))

    # ---- sizing ----------------------------------------------------------------------------
    def _max_model_len(self) -> int:
        limit = self.model_config.max_model_len_cap  # positions, and the sliding window if any
        if self.config.max_model_len is None:
            return limit
        if self.config.max_model_len > limit:
            raise ValueError(f"max_model_len {self.config.max_model_len} exceeds what the model "
                             f"supports ({limit} tokens)")
        return self.config.max_model_len

    def _num_kv_blocks(self) -> int:
        if self.config.num_gpu_blocks_override is not None:
            return self.config.num_gpu_blocks_override
        per_block = kv_cache_bytes_per_block(self.model_config, self.config.block_size, self.kv_cache_dtype)
        if self.device.type == "cuda":
            budget = self._profile_cuda_budget()
        else:
            budget = self.config.kv_cache_memory
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(f"the KV cache budget ({budget} bytes) holds no block of {per_block} bytes")
        return num_blocks

    def _num_swap_blocks(self) -> int:
        """Blocks in swap_space GiB of CPU memory; more than MAX_SWAP_SHARE of the machine's memory
        is refused (it would leave too little for everything else, as vLLM also refuses)."""
        swap_bytes = int(self.config.swap_space * (1 << 30))
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if swap_bytes > MAX_SWAP_SHARE * total:
            raise ValueError(f"swap_space {self.config.swap_space} GiB is more than {MAX_SWAP_SHARE:.0%} of this "
                             f"machine's {total / (1 << 30):.1f} GiB of memory")
        per_block = kv_cache_bytes_per_block(self.model_config, self.config.block_size, self.kv_cache_dtype)
        if swap_bytes < per_block:
            raise ValueError(f"swap_space {self.config.swap_space} GiB holds no KV block of {per_block} bytes")
        return swap_bytes // per_block

    def _profile_cuda_budget(self) -> int:
        """gpu_memory_utilization x device memory, minus weights and the peak of the largest step
        (a forward over the full token budget, its logits at max_num_seqs rows, or at as many as
        the default may pick), run on a throwaway cache just big enough for it."""
        num_tokens, max_len, bs = self.config.max_num_batched_tokens, self.max_model_len, self.config.block_size
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        runner = self._new_runner(dummy_step_blocks(num_tokens, max_len, bs))
        num_sampled = self.config.max_num_seqs or min(MAX_DEFAULT_SEQS, num_tokens)
        runner.dummy_step(num_tokens, max_len, num_sampled=num_sampled)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del runner
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(total * self.config.gpu_memory_utilization) - peak
