"""Guided decoding in the decode loop: compile constraints off the loop, mask the guided rows'
logits with one bitmask per step, advance each sequence's matcher with its sampled token.

A step spends a bounded time on matchers' new work (rows of states not seen before, completion
searches: grammar/allowance.py), and one unit of it per row beyond that: on a GPU the device's
recent forward time (engine/forward_clock.py; at least MIN_STEP_ALLOWANCE_S), since rows made
while the forward runs cost nothing and a wait past its end stalls the whole batch; elsewhere
STEP_ALLOWANCE_S. A sequence whose row is not ready by then is parked: it skips this step's sample
and retries in the next with its finished work cached (a mask worker goes on with it meanwhile);
the batch goes on without it."""
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import torch

from gdserve.engine.request import Sequence
from gdserve.grammar import Grammar, allocate_token_bitmask
from gdserve.grammar.allowance import Allowance, MaskPending, allowing
from gdserve.grammar.completion_size import min_completion_tokens, shortest_completion_bytes
from gdserve.grammar.forced import take_forced_tokens, text_encoder
from gdserve.grammar.matcher import stack_rows
from gdserve.grammar.matcher_pool import PARKED, READY, MatcherPool, RemoteMatcher, Unplaceable, advance_matcher
from gdserve.grammar.service import CompileService, CompilerUnavailableError
from gdserve.kernels import apply_token_bitmask
from gdserve.kernels.bitmask import bitmask_width
from gdserve.sampling_params import StructuredOutputsParams

STEP_ALLOWANCE_S = 0.02  # a step's wait on new mask work where the forward is not timed
MIN_STEP_ALLOWANCE_S = 0.002  # the least a step waits on it on a GPU
MAX_STEP_TIMES = 1 << 16  # steps whose guided host time an engine keeps (the newest)


def _budget(seq: Sequence) -> int:
    """After the next token, max_tokens leaves this many for the rest and EOS: the matcher keeps
    the constraint completable within them (unbounded strings close in time)."""
    return seq.max_tokens - seq.num_output_tokens - 2


def _next_rows(live: list[tuple[int, Sequence]], guard: Callable[[Sequence], AbstractContextManager],
               allowance: Allowance) -> tuple[list[int], list[torch.Tensor], list[Sequence]]:
    """(row index, packed row) of each (row index, sequence) in live whose row is ready, and the
    sequences whose row is not (MaskPending). Unguarded until a matcher raises anything else
    (a guard per row costs as much as the row): that sequence's exception then goes through
    guard(seq), which contains it, and the rest run inside their guards."""
    rows, words, parked = [], [], []
    done = 0
    with allowing(allowance):
        try:
            for i, seq in live:
                _add_row(i, seq, allowance, rows, words, parked)
                done += 1
            return rows, words, parked
        except Exception as error:  # noqa: BLE001 (contained by the failed sequence's guard)
            with guard(live[done][1]):
                raise error
        for i, seq in live[done + 1:]:
            with guard(seq):
                _add_row(i, seq, allowance, rows, words, parked)
    return rows, words, parked


def _add_row(i: int, seq: Sequence, allowance: Allowance, rows: list[int], words: list[torch.Tensor],
             parked: list[Sequence]) -> None:
    allowance.next_row()
    try:
        words.append(seq.matcher.next_token_row(_budget(seq)))
        rows.append(i)
    except MaskPending:
        parked.append(seq)


def check_fits(grammar: Grammar, max_tokens: int) -> None:
    """ValueError naming the minimum when max_tokens cannot hold the constraint's shortest
    completion and its EOS (the output would be cut, not complete). A completion's bytes bound its
    tokens from above, so only a max_tokens below them costs the exact count."""
    shortest = shortest_completion_bytes(grammar)
    if shortest is None or shortest < max_tokens:
        return
    needed = min_completion_tokens(grammar)
    if needed is not None and needed + 1 > max_tokens:
        raise ValueError(f"max_tokens {max_tokens} cannot hold a complete output of the constraint: its "
                         f"shortest takes {needed} tokens, and EOS one more; set max_tokens to at least "
                         f"{needed + 1}")


class GuidedDecoder:
    def __init__(self, tokenizer, eos_token_ids: set[int], vocab_size: int, compile_timeout_s: float,
                 compile_workers: int, cache_dir: Path | None = None, mask_workers: int = 0,
                 forced_tokens: bool = False):
        """mask_workers: processes holding the matchers (grammar/matcher_pool.py), so that a step's
        rows are computed on that many cores at once; 0: on the engine's thread. forced_tokens:
        advance also takes the forced text after each sampled token (see advance)."""
        self.tokenizer = tokenizer
        self.forced_tokens = forced_tokens
        self.encode = text_encoder(tokenizer)
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.compile_timeout_s = compile_timeout_s
        self.compile_workers = compile_workers
        self.mask_workers = mask_workers
        self.cache_dir = cache_dir
        self._service: CompileService | None = None
        self._pool: MatcherPool | None = None
        self._closed = False
        self._bitmask = allocate_token_bitmask(1, vocab_size)
        self._indices = torch.empty(1, dtype=torch.int64)
        self._device: tuple[torch.Tensor, torch.Tensor] | None = None  # see _buffers
        self._allowance = Allowance.of(STEP_ALLOWANCE_S)
        self._step_mask_s = 0.0
        self._step_rows = 0
        self._step_parked = 0
        # (step seconds, of which host seconds on guided rows: accepts, termination checks, masks;
        # the guided rows masked or parked; of them parked), for each step that had guided rows:
        # what the benches report as the share of a step spent on masks, the host time per row
        # and the share of rows parked.
        self.step_times: deque[tuple[float, float, int, int]] = deque(maxlen=MAX_STEP_TIMES)

    @property
    def service(self) -> CompileService:
        """Started on first use (the engine's start_workers)."""
        if self._closed:
            raise CompilerUnavailableError("the engine is closed: no more constraints compile")
        if self._service is None:
            self._service = CompileService(self.tokenizer, max_workers=self.compile_workers,
                                           timeout_s=self.compile_timeout_s,
                                           eos_token_ids=self.eos_token_ids, vocab_size=self.vocab_size,
                                           cache_dir=self.cache_dir, keep_payloads=self.mask_workers > 0)
        return self._service

    @property
    def pool(self) -> MatcherPool:
        if self._pool is None:
            self._pool = MatcherPool(self.service.vocab, self.mask_workers, bitmask_width(self.vocab_size),
                                     self.encode)
        return self._pool

    def start_workers(self) -> None:
        """Start the compile (and mask) workers in the background, beside the model's load, so
        that the first guided requests wait for their compiles only, not for the workers' start
        (seconds each)."""
        self.service.start_workers()
        if self.mask_workers:
            self.pool.start()

    @property
    def busy_workers(self) -> int:
        """Compile workers busy with this engine's constraints."""
        return 0 if self._service is None else self._service.num_busy

    def submit(self, guided: StructuredOutputsParams) -> Future[Grammar]:
        return self.service.submit(guided.kind, guided.spec, **guided.compile_options())

    def new_matcher(self, grammar: Grammar, seq: Sequence) -> tuple[object, list[int]]:
        """A sequence's matcher: in a mask worker where there are any, else (or where the grammar
        cannot travel there: a custom one that does not pickle) here; and the forced tokens at
        its start, which it is past (none unless forced_tokens is on: see advance)."""
        local = grammar.matcher()
        forced = take_forced_tokens(local, self.encode, b"", self._force_limit(seq))
        if self.mask_workers:
            try:
                return self.pool.matcher(grammar, self.service.take_payload(grammar), forced), forced
            except Unplaceable:
                pass
        return local, forced

    def begin_step(self, forward_s: float | None = None) -> None:
        """Start the step's allowance for new mask work (advance and apply_bitmask): the
        device's recent forward time where known (the step's forward runs meanwhile)."""
        self._allowance = Allowance.of(STEP_ALLOWANCE_S if forward_s is None else max(MIN_STEP_ALLOWANCE_S, forward_s))

    def end_step(self, step_s: float) -> None:
        """Record the step's guided host time beside its length, where it had any."""
        if self._step_mask_s:
            self.step_times.append((step_s, self._step_mask_s, self._step_rows, self._step_parked))
        self._step_mask_s, self._step_rows, self._step_parked = 0.0, 0, 0

    def advance(self, sampled: list[tuple[Sequence, int]]) -> list[tuple[int | Exception, list[int]]]:
        """Advance each guided sequence's matcher by its sampled token: per sequence (ACCEPTED,
        REFUSED (the grammar refuses the token), TERMINATED (accepted, and only EOS can follow;
        not known within the step's allowance counts as not: the next row then holds only EOS),
        or the exception its matcher raised; the forced tokens). With forced_tokens on, a
        sequence that does not ask for logprobs also takes the tokens of the forced text after its
        token (grammar/forced.py), at most what max_tokens leaves: its matcher is past them, and
        the verdict is the one after them."""
        start = time.perf_counter()
        answers: list[tuple | None] = [None] * len(sampled)
        remote = [k for k, (seq, _) in enumerate(sampled) if isinstance(seq.matcher, RemoteMatcher)]
        if remote:
            items = [(seq.matcher, token_id, _budget(seq), self._force_limit(seq))
                     for seq, token_id in (sampled[k] for k in remote)]
            for k, (answer, forced) in zip(remote, self.pool.advance(items, self._allowance.deadline)):
                answers[k] = (answer if isinstance(answer, int) else RuntimeError(answer), forced)
        for k, (seq, token_id) in enumerate(sampled):
            if answers[k] is None:
                answers[k] = advance_matcher(seq.matcher, token_id, self._allowance, self._force_limit(seq),
                                             self.encode)
        self._step_mask_s += time.perf_counter() - start
        return answers

    def _force_limit(self, seq: Sequence) -> int:
        """Forced tokens the sequence may take after its sampled one: none where it asks for
        logprobs (its every token then comes from a decode step, with the model's logprob)."""
        if not self.forced_tokens or seq.params.sampled_logprobs is not None:
            return 0
        return seq.max_tokens - seq.num_output_tokens

    def apply_bitmask(self, logits: torch.Tensor, seqs: list[Sequence],
                      guard: Callable[[Sequence], AbstractContextManager]) -> list[Sequence]:
        """Mask row i of logits by seqs[i]'s matcher, for every guided sequence still running, in
        one apply, and return the parked sequences (rows not ready within the step's allowance:
        the caller samples without them). Runs while the GPU computes the step's forward; the
        rows go over in one pinned copy. A matcher's exception goes through guard(seq), which
        contains it: a row whose matcher raised is left unmasked (its sequence has been
        finished, so its token is dropped)."""
        start = time.perf_counter()
        live = [(i, seq) for i, seq in enumerate(seqs) if seq.matcher is not None and not seq.is_finished]
        if not live:
            return []
        host, device = self._buffers(len(live), logits.device)
        remote = [(i, seq) for i, seq in live if isinstance(seq.matcher, RemoteMatcher)]
        rows, parked = self._remote_rows(remote, host, guard) if remote else ([], [])
        if len(remote) < len(live):
            local_rows, words, local_parked = _next_rows(
                [(i, seq) for i, seq in live if not isinstance(seq.matcher, RemoteMatcher)], guard, self._allowance)
            if local_rows:
                stack_rows(host[len(rows):len(rows) + len(local_rows)], words, self.vocab_size)
            rows, parked = rows + local_rows, parked + local_parked
        if rows:
            self._mask(logits, rows, host[:len(rows)], device)
        if rows or parked:
            self._step_mask_s += time.perf_counter() - start
            self._step_rows += len(rows) + len(parked)
            self._step_parked += len(parked)
        return parked

    def _remote_rows(self, remote: list[tuple[int, Sequence]], host: torch.Tensor,
                     guard: Callable[[Sequence], AbstractContextManager]) -> tuple[list[int], list[Sequence]]:
        """The rows of sequences whose matchers live in mask workers, into host from its first
        row on: (their row indices, the parked sequences)."""
        answers = self.pool.fill_rows([(seq.matcher, _budget(seq)) for _, seq in remote], self._allowance.deadline,
                                      host.numpy().view(np.uint32))
        rows, parked = [], []
        for (i, seq), answer in zip(remote, answers):
            if answer == READY:
                rows.append(i)
            elif answer == PARKED:
                parked.append(seq)
            else:
                with guard(seq):
                    raise RuntimeError(answer)
        return rows, parked

    def _mask(self, logits: torch.Tensor, rows: list[int], host: torch.Tensor, device: tuple | None) -> None:
        """Apply host[k] (packed, filled) to logits row rows[k]."""
        num_rows = len(rows)
        indices = self._indices[:num_rows]
        indices.numpy()[:] = rows
        if device is not None:  # CUDA: pinned to buffers that stay allocated, behind the step's work
            device[0][:num_rows].copy_(host, non_blocking=True)
            device[1][:num_rows].copy_(indices, non_blocking=True)
            apply_token_bitmask(logits, device[0][:num_rows], device[1][:num_rows])
        else:
            apply_token_bitmask(logits, host, indices)

    def _buffers(self, num_rows: int, device: torch.device) -> tuple[torch.Tensor, tuple | None]:
        """The step's host rows and row indices (self._indices), pinned on CUDA, and on CUDA the
        device's bitmask and row indices, allocated once and grown by doubling (no allocation per
        step). The copies are async; the next fill comes after the engine has waited for this
        step's sampled tokens."""
        cuda = device.type == "cuda"
        if self._bitmask.shape[0] < num_rows or cuda != self._bitmask.is_pinned():
            size = max(num_rows, 2 * self._bitmask.shape[0])
            self._bitmask = allocate_token_bitmask(size, self.vocab_size)
            self._indices = torch.empty(size, dtype=torch.int64)
            self._device = None
            if cuda:
                self._bitmask, self._indices = self._bitmask.pin_memory(), self._indices.pin_memory()
                self._device = (torch.empty_like(self._bitmask, device=device),
                                torch.empty(size, dtype=torch.int64, device=device))
        return self._bitmask[:num_rows], self._device

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._service is not None:
            self._service.close()
            self._service = None

