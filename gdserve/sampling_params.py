"""Per-request sampling parameters, with vLLM's names and defaults."""
from dataclasses import dataclass

from gdserve.utils import reject_unknown_fields


@reject_unknown_fields("structured outputs parameter")
@dataclass(kw_only=True)
class StructuredOutputsParams:
    """Exactly one constraint: a JSON Schema (dict, JSON string or pydantic model class), a regex,
    a list of choices, a Lark grammar, or json_object=True (any JSON object); vLLM's names."""
    json: dict | str | type | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None   # json only: replaces the default bounded whitespace
    disable_any_whitespace: bool = False    # json only: no whitespace between JSON tokens
    # json only. False: undeclared keys wherever JSON Schema admits them; None or True: objects
    # that declare properties take only those (the default)
    disable_additional_properties: bool | None = None
    disable_fallback: bool = False          # accepted: there is one backend, which never falls back
    lenient: bool = False                   # json only: relax unsupported keywords (reported)

    def __post_init__(self) -> None:
        if isinstance(self.json, type) and hasattr(self.json, "model_json_schema"):
            self.json = self.json.model_json_schema()
        if self.json_object is False:
            self.json_object = None
        kinds = [k for k in _GUIDED_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"structured outputs take exactly one of {', '.join(_GUIDED_KINDS)}; "
                             f"got {', '.join(kinds) if kinds else 'none'}")
        json_only = {"whitespace_pattern": self.whitespace_pattern is not None,
                     "disable_any_whitespace": self.disable_any_whitespace,
                     "disable_additional_properties": self.disable_additional_properties is not None}
        for name, given in json_only.items():
            if given and self.kind not in _JSON_KINDS:
                raise ValueError(f"{name} applies to json constraints only")
        if self.disable_any_whitespace and self.whitespace_pattern is not None:
            raise ValueError("disable_any_whitespace and whitespace_pattern exclude each other")

    @property
    def kind(self) -> str:
        return next(k for k in _GUIDED_KINDS if getattr(self, k) is not None)

    @property
    def spec(self) -> dict | str | list[str]:
        return getattr(self, self.kind)

    def compile_options(self) -> dict:
        if self.kind not in _JSON_KINDS:
            return {}
        whitespace = "" if self.disable_any_whitespace else self.whitespace_pattern
        return {"whitespace_pattern": whitespace, "lenient": self.lenient,
                "open_objects": self.disable_additional_properties is False}


# vLLM's name before 0.12 (SamplingParams(guided_decoding=GuidedDecodingParams(...))).
GuidedDecodingParams = StructuredOutputsParams


_GUIDED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_JSON_KINDS = ("json", "json_object")


@reject_unknown_fields("sampling parameter")
@dataclass(kw_only=True)
class SamplingParams:
    n: int = 1
    best_of: int | None = None              # candidates generated, of which the n of highest
                                            # cumulative logprob return (None: n)
    max_tokens: int | None = 16             # None: up to max_model_len (the engine resolves it)
    temperature: float = 1.0                # 0: greedy
    top_p: float = 1.0
    top_k: int = 0                          # 0 or -1: off (-1 is normalized to 0)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None     # normalized to list[str]
    stop_token_ids: list[int] | None = None  # normalized to list[int]
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None             # number of top logprobs; 0: only the sampled token's
    skip_special_tokens: bool = True
    # Constrain the output (JSON Schema, regex, ...): a StructuredOutputsParams or a dict of its fields
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | None = None  # vLLM's name before 0.12, the same
    # "cumulative": an output at every step (streaming); "final_only": one when it finishes
    output_kind: str = "cumulative"

    def __post_init__(self) -> None:
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.best_of is None:
            self.best_of = self.n
        if self.logit_bias is not None:
            self.logit_bias = _normalize_logit_bias(self.logit_bias)
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("guided_decoding is structured_outputs under vLLM's name before 0.12: give one")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        _check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", "a StructuredOutputsParams or a dict of its fields", self.structured_outputs)
        self._validate()

    @property
    def sampled_logprobs(self) -> int | None:
        """Top logprobs the sampler returns per token: the user's, or 0 (the sampled token's alone)
        when best_of candidates are ranked by cumulative logprob."""
        if self.logprobs is None and self.best_of > self.n:
            return 0
        return self.logprobs

    def _validate(self) -> None:
        _check(self.n >= 1, "n", ">= 1", self.n)
        _check(isinstance(self.best_of, int) and self.best_of >= self.n, "best_of", f"an integer >= n ({self.n})",
               self.best_of)
        _check(self.output_kind in ("cumulative", "final_only"), "output_kind",
               "'cumulative' or 'final_only'", self.output_kind)
        if self.max_tokens is not None:
            _check(self.max_tokens >= 1, "max_tokens", ">= 1 (or None)", self.max_tokens)
        _check(self.temperature >= 0, "temperature", ">= 0", self.temperature)
        _check(0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _check(self.top_k >= 0, "top_k", "-1, 0 (off) or a positive integer", self.top_k)
        _check(0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        _check(-2 <= self.presence_penalty <= 2, "presence_penalty", "in [-2, 2]", self.presence_penalty)
        _check(-2 <= self.frequency_penalty <= 2, "frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        _check(self.repetition_penalty > 0, "repetition_penalty", "> 0", self.repetition_penalty)
        _check(self.min_tokens >= 0, "min_tokens", ">= 0", self.min_tokens)
        if self.seed is not None:  # torch's generators take 64 bits
            _check(-2**63 <= self.seed < 2**63, "seed", "a 64-bit signed integer", self.seed)
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        if self.logprobs is not None:
            _check(0 <= self.logprobs <= 20, "logprobs", "in [0, 20] (or None)", self.logprobs)
        for s in self.stop:
            _check(isinstance(s, str) and s != "", "stop", "non-empty strings", s)
        for t in self.stop_token_ids:
            _check(isinstance(t, int) and t >= 0, "stop_token_ids", "non-negative integers", t)
        for token_id, bias in (self.logit_bias or {}).items():
            _check(-100 <= bias <= 100, f"logit_bias[{token_id}]", "in [-100, 100]", bias)


def _check(ok: bool, field: str, accepted: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field} must be {accepted}, got {value!r}")


def _normalize_logit_bias(logit_bias: dict) -> dict[int, float]:
    """JSON object keys are strings: accept "123" as token id 123."""
    out = {}
    for key, bias in logit_bias.items():
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key)
        _check(isinstance(key, int) and not isinstance(key, bool) and key >= 0,
               "logit_bias keys", "non-negative token ids (int or digit strings)", key)
        _check(isinstance(bias, (int, float)) and not isinstance(bias, bool),
               f"logit_bias[{key}]", "a number in [-100, 100]", bias)
        out[key] = float(bias)
    return out
