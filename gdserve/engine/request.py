"""Per-sequence state. A request fans out into best_of Sequences (n unless set): one per candidate."""
import enum
import time
from dataclasses import dataclass, field

import torch

from gdserve.engine.detokenizer import IncrementalDetokenizer
from gdserve.lora.request import LoRARequest
from gdserve.sampling_params import SamplingParams


# Stands in token_ids for a token sampled on the device and not yet read back (async scheduling):
# the next step takes its input from the device, and the engine writes the value in when it lands.
PLACEHOLDER = -1
# Stands in block_table for a block swapped out to the CPU (Sequence.swapped_blocks has its CPU block).
SWAPPED = -1


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    SWAPPED = enum.auto()
    FINISHED = enum.auto()


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int                    # which of the request's best_of candidates (n unless best_of > n)
    token_ids: list[int]          # prompt + output so far
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int               # resolved (params.max_tokens may be None)
    detokenizer: IncrementalDetokenizer | None
    generator: torch.Generator | None
    matcher: object | None = None  # a gdserve.grammar Matcher for guided requests
    lora_request: LoRARequest | None = None
    extra_keys: tuple = ()        # mixed into block hashes: the LoRA id, whose KV differs from the base's
    # The sample that computes the shared prompt; siblings wait for it to hit its prefix blocks.
    leader: "Sequence | None" = None
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[tuple[int, tuple]] = field(default_factory=list)  # of full blocks, in order
    swapped_blocks: dict[int, int] = field(default_factory=dict)  # block_table index -> CPU block
    num_computed_tokens: int = 0
    num_registered_blocks: int = 0  # leading full blocks already offered to the prefix cache
    num_cached_tokens: int = 0    # prompt tokens served by the prefix cache at admission
    num_preemptions: int = 0
    num_forced_tokens: int = 0    # output tokens taken from the constraint's forced text, not sampled
    pending_row: int = -1         # row of its in-flight token (the PLACEHOLDER) in the last sampled batch
    text: str = ""                # detokenized output released so far (stop strings cut)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    arrival_time: float = field(default_factory=time.monotonic)

    @property
    def lora_int_id(self) -> int:
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def is_prefilled(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens

    def update_block_hashes(self, block_size: int, hash_fn) -> None:
        """Extend block_hashes over the full blocks of token_ids (tokens only ever append)."""
        for i in range(len(self.block_hashes), self.num_tokens // block_size):
            parent = self.block_hashes[-1][0] if self.block_hashes else None
            chunk = tuple(self.token_ids[i * block_size:(i + 1) * block_size])
            self.block_hashes.append(hash_fn(parent, chunk, self.extra_keys))
