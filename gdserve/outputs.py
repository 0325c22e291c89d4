from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None     # "stop" | "length" | "abort" | "error"; None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None  # per token: {token_id: logprob}, sampled first
    num_forced_tokens: int = 0  # of token_ids, those the constraint forced (appended without a decode step)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0           # prompt tokens served by the prefix cache
    error: str | None = None             # why the request failed (e.g. its grammar did not compile)
    metrics: dict = field(default_factory=dict)
    # Tokens generated for the request: with best_of > n, those of the candidates not returned too.
    # None: those of outputs.
    num_generated_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.num_generated_tokens is None:
            self.num_generated_tokens = sum(len(o.token_ids) for o in self.outputs)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
