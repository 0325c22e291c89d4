"""Guided decoding in the decode loop: compile constraints off the loop, mask the guided rows'
logits with one bitmask per step, advance each sequence's matcher with its sampled token."""
from concurrent.futures import Future

import torch

from gdserve.engine.request import Sequence
from gdserve.grammar import Grammar, allocate_token_bitmask
from gdserve.grammar.service import CompileService
from gdserve.kernels import apply_token_bitmask
from gdserve.sampling_params import GuidedDecodingParams


class GuidedDecoder:
    def __init__(self, tokenizer, eos_token_ids: set[int], vocab_size: int, compile_timeout_s: float,
                 compile_workers: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.compile_timeout_s = compile_timeout_s
        self.compile_workers = compile_workers
        self._service: CompileService | None = None
        self._bitmask = allocate_token_bitmask(1, vocab_size)

    @property
    def service(self) -> CompileService:
        """Started on first use: a server that never sees a guided request spawns no workers."""
        if self._service is None:
            self._service = CompileService(self.tokenizer, max_workers=self.compile_workers,
                                           timeout_s=self.compile_timeout_s,
                                           eos_token_ids=self.eos_token_ids, vocab_size=self.vocab_size)
        return self._service

    def submit(self, guided: GuidedDecodingParams) -> Future[Grammar]:
        return self.service.submit(guided.kind, guided.spec, **guided.compile_options())

    def apply_bitmask(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Mask row i of logits by seqs[i]'s matcher, for every guided sequence, in one apply."""
        rows = [i for i, seq in enumerate(seqs) if seq.matcher is not None]
        if not rows:
            return
        if self._bitmask.shape[0] < len(rows):
            self._bitmask = allocate_token_bitmask(max(len(rows), 2 * self._bitmask.shape[0]), self.vocab_size)
        bitmask = self._bitmask[:len(rows)]
        for j, i in enumerate(rows):
            seq = seqs[i]
            # After this token, max_tokens leaves this many for the rest and EOS: the matcher
            # keeps the constraint completable within them (unbounded strings close in time).
            budget = seq.max_tokens - seq.num_output_tokens - 2
            seq.matcher.fill_next_token_bitmask(bitmask, j, budget=budget)
        indices = torch.tensor(rows, device=logits.device)
        apply_token_bitmask(logits, bitmask.to(logits.device, non_blocking=True), indices)

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
            self._service = None
