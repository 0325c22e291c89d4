"""Batched sampling over the logits of the rows sampled this step.

Order: logit_bias -> min_tokens masking -> penalties -> (logprobs) -> greedy argmax, or
temperature -> top_k -> top_p -> min_p -> a draw from the softmax. On the device every row is
drawn in one pass (gumbel_argmax: temperature and noise fused, greedy rows at temperature 0); on
the CPU by the inverse CDF. A feature no row uses is None in the SamplingBatch and costs
nothing, so an all-greedy batch is one argmax.

The logits come in the model's dtype. Everything but the one-pass draw and the argmax reads a
float32 copy (exact from bfloat16 and float16, so every result is that of float32 logits): a
batch that needs neither a feature nor the inverse CDF reads the model's logits once, as they are.
"""
import itertools
from dataclasses import dataclass

import torch

from gdserve.kernels import gumbel_argmax
from gdserve.sampling_params import SamplingParams
from gdserve.utils import to_device

# Temperatures below this are treated as greedy (dividing by them would overflow).
_GREEDY_TEMPERATURE = 1e-5


@dataclass
class RepetitionPenalty:
    """HF semantics over prompt + output tokens: divide positive logits, multiply negative ones."""
    rows: torch.Tensor      # [R] rows of the batch that use it
    penalty: torch.Tensor   # [R, 1]
    seen: torch.Tensor      # [R, V] bool: token occurs in the prompt or the output


@dataclass
class FrequencyPresencePenalty:
    """OpenAI semantics over output tokens: logit -= frequency * count + presence * (count > 0)."""
    rows: torch.Tensor      # [R]
    frequency: torch.Tensor  # [R, 1]
    presence: torch.Tensor  # [R, 1]
    counts: torch.Tensor    # [R, V] float: occurrences in the output


@dataclass
class SamplingBatch:
    sample_rows: torch.Tensor                # [S] rows sampled at random; the others take the argmax
    all_sampled: bool                        # every row is (S == N): no argmax, no gather
    temperature: torch.Tensor | None         # [S, 1]; None: 1.0 in every sampled row
    top_k: torch.Tensor | None               # [S] (vocab size where off); None: no row uses it
    max_top_k: int                           # largest top_k in use (0 if none)
    top_p: torch.Tensor | None               # [S] (1.0 where off)
    min_p: torch.Tensor | None               # [S] (0.0 where off)
    seeded: list[tuple[int, torch.Generator]]  # (index into sample_rows, its generator)
    all_seeded: bool
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # rows, token ids, values
    min_tokens_mask: tuple[torch.Tensor, torch.Tensor] | None          # rows, token ids
    repetition: RepetitionPenalty | None
    frequency_presence: FrequencyPresencePenalty | None
    max_num_logprobs: int | None             # None: no row wants logprobs

    @property
    def truncates(self) -> bool:
        """Whether some row uses top_k, top_p or min_p."""
        return self.top_k is not None or self.top_p is not None or self.min_p is not None

    @property
    def needs_float32(self) -> bool:
        """Whether some row reads or updates the logits before the draw (logit_bias, min_tokens,
        penalties, logprobs, truncation): all of that runs on float32 logits."""
        return (self.logit_bias is not None or self.min_tokens_mask is not None or self.repetition is not None
                or self.frequency_presence is not None or self.max_num_logprobs is not None or self.truncates)

    @classmethod
    def build(cls, params: list[SamplingParams], token_ids: list[list[int]], num_prompt_tokens: list[int],
              generators: list[torch.Generator | None],
              stop_ids_until_min: list[set[int]], vocab_size: int,
              device: torch.device | str) -> "SamplingBatch":
        sampled = [i for i, p in enumerate(params) if p.temperature >= _GREEDY_TEMPERATURE]
        sp = [params[i] for i in sampled]
        top_ks = [p.top_k for p in sp if 0 < p.top_k < vocab_size]
        seeded = [(j, generators[i]) for j, i in enumerate(sampled) if generators[i] is not None]
        logprobs = [p.sampled_logprobs for p in params if p.sampled_logprobs is not None]
        return cls(
            sample_rows=_long(sampled, device),
            all_sampled=len(sampled) == len(params),
            temperature=(_float([p.temperature for p in sp], device).unsqueeze(1)
                         if any(p.temperature != 1.0 for p in sp) else None),
            top_k=(_long([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in sp], device)
                   if top_ks else None),
            max_top_k=max(top_ks, default=0),
            top_p=(_float([p.top_p for p in sp], device)
                   if any(p.top_p < 1 for p in sp) else None),
            min_p=(_float([p.min_p for p in sp], device)
                   if any(p.min_p > 0 for p in sp) else None),
            seeded=seeded,
            all_seeded=len(seeded) == len(sampled),
            logit_bias=_logit_bias(params, device),
            min_tokens_mask=_min_tokens_mask(stop_ids_until_min, device),
            repetition=_repetition(params, token_ids, vocab_size, device),
            frequency_presence=_frequency_presence(params, token_ids, num_prompt_tokens, vocab_size, device),
            max_num_logprobs=max(logprobs) if logprobs else None,
        )


def _long(values: list[int], device) -> torch.Tensor:
    return to_device(values, torch.long, device)


def _float(values: list[float], device) -> torch.Tensor:
    return to_device(values, torch.float32, device)


def _logit_bias(params: list[SamplingParams], device) -> tuple[torch.Tensor, ...] | None:
    entries = [(row, token, bias) for row, p in enumerate(params)
               for token, bias in (p.logit_bias or {}).items()]
    if not entries:
        return None
    rows, tokens, biases = zip(*entries)
    return _long(rows, device), _long(tokens, device), _float(biases, device)


def _min_tokens_mask(stop_ids_until_min: list[set[int]], device) -> tuple[torch.Tensor, ...] | None:
    entries = [(row, token) for row, ids in enumerate(stop_ids_until_min) for token in ids]
    if not entries:
        return None
    rows, tokens = zip(*entries)
    return _long(rows, device), _long(tokens, device)


def _token_counts(token_ids: list[list[int]], vocab_size: int, device) -> torch.Tensor:
    """[R, V] float occurrence counts: one accumulating scatter of the concatenated ids."""
    flat = _long(list(itertools.chain.from_iterable(token_ids)), device)
    rows = torch.repeat_interleave(torch.arange(len(token_ids), device=device),
                                   _long([len(ids) for ids in token_ids], device))
    counts = torch.zeros(len(token_ids), vocab_size, device=device)
    return counts.index_put_((rows, flat), torch.ones_like(flat, dtype=counts.dtype), accumulate=True)


def _repetition(params, token_ids, vocab_size, device) -> RepetitionPenalty | None:
    rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if not rows:
        return None
    ids = [token_ids[i] for i in rows]  # prompt and output
    return RepetitionPenalty(
        rows=_long(rows, device),
        penalty=_float([params[i].repetition_penalty for i in rows], device).unsqueeze(1),
        seen=_token_counts(ids, vocab_size, device) > 0)


def _frequency_presence(params, token_ids, num_prompt_tokens, vocab_size, device) -> FrequencyPresencePenalty | None:
    rows = [i for i, p in enumerate(params) if p.frequency_penalty != 0 or p.presence_penalty != 0]
    if not rows:
        return None
    return FrequencyPresencePenalty(
        rows=_long(rows, device),
        frequency=_float([params[i].frequency_penalty for i in rows], device).unsqueeze(1),
        presence=_float([params[i].presence_penalty for i in rows], device).unsqueeze(1),
        counts=_token_counts([token_ids[i][num_prompt_tokens[i]:] for i in rows], vocab_size, device))


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor                  # [N] long
    logprobs: torch.Tensor | None            # [N] float: log-prob of the sampled token
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # ids [N, k], log-probs [N, k], descending

    def to_host(self) -> "HostSamplerOutput":
        """Start copying to host memory behind the sampling kernels (pinned and non-blocking
        on CUDA): the caller goes on while the device works, and reads them with wait()."""
        def copy(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to("cpu", non_blocking=True)
        top = None if self.top_logprobs is None else (copy(self.top_logprobs[0]), copy(self.top_logprobs[1]))
        host = HostSamplerOutput(copy(self.token_ids), copy(self.logprobs), top, None)
        if self.token_ids.is_cuda:
            host.ready = torch.cuda.Event()
            host.ready.record()
        return host


@dataclass
class HostSamplerOutput:
    token_ids: torch.Tensor
    logprobs: torch.Tensor | None
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None
    ready: "torch.cuda.Event | None"         # recorded after the copies (CUDA)

    def wait(self) -> tuple[list[int], list[float] | None, tuple[list, list] | None]:
        """Block until the copies have landed; (token ids, logprobs, (top ids, top logprobs))."""
        if self.ready is not None:
            self.ready.synchronize()
        logprobs = self.logprobs.tolist() if self.logprobs is not None else None
        top = None if self.top_logprobs is None else (self.top_logprobs[0].tolist(), self.top_logprobs[1].tolist())
        return self.token_ids.tolist(), logprobs, top


class Sampler:
    def __init__(self, one_pass_draw: bool | None = None):
        """one_pass_draw: draw with gumbel_argmax (the device's way) rather than the inverse CDF
        (the CPU's); None: on CUDA only."""
        self.one_pass_draw = one_pass_draw

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """logits: [N, V] in the model's dtype (float32, bfloat16 or float16); may be modified in
        place, so the caller must not read them afterwards. Read in that dtype only by the
        one-pass draw and the argmax; everything else reads a float32 copy."""
        one_pass = logits.is_cuda if self.one_pass_draw is None else self.one_pass_draw
        if batch.needs_float32 or (not one_pass and batch.sample_rows.numel()):  # the inverse CDF's softmax too
            logits = logits.float()
        logits = self.process_logits(logits, batch)
        # Logprobs describe the processed distribution before temperature and truncation
        # (what the model, with the request's biases and penalties, assigns to each token).
        logprobs = torch.log_softmax(logits, dim=-1) if batch.max_num_logprobs is not None else None
        if one_pass and batch.sample_rows.numel():
            token_ids = draw_in_one_pass(logits, batch)
        elif batch.all_sampled:
            token_ids = self.sample(logits, batch)
        else:
            token_ids = logits.argmax(dim=-1)
            if batch.sample_rows.numel():
                token_ids[batch.sample_rows] = self.sample(logits[batch.sample_rows], batch)
        return SamplerOutput(token_ids, *_gather_logprobs(logprobs, token_ids, batch.max_num_logprobs))

    @staticmethod
    def process_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        if batch.logit_bias is not None:
            rows, tokens, biases = batch.logit_bias
            logits.index_put_((rows, tokens), biases, accumulate=True)
        if batch.min_tokens_mask is not None:
            logits[batch.min_tokens_mask] = float("-inf")
        if batch.repetition is not None:
            rep = batch.repetition
            sub = logits[rep.rows]
            penalized = torch.where(sub > 0, sub / rep.penalty, sub * rep.penalty)
            logits[rep.rows] = torch.where(rep.seen, penalized, sub)
        if batch.frequency_presence is not None:
            fp = batch.frequency_presence
            logits[fp.rows] -= fp.frequency * fp.counts + fp.presence * (fp.counts > 0)
        return logits

    @staticmethod
    def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """logits: [S, V] of the sampled rows (overwritten) -> [S] token ids, the CPU's way."""
        return inverse_cdf(truncate(logits, batch), batch)


def truncate(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """logits: [S, V] of the sampled rows (overwritten) over their temperature, with the tokens
    outside top_k, top_p and min_p at -inf."""
    if batch.temperature is not None:
        logits.div_(batch.temperature)
    if batch.top_p is not None:
        logits = _top_k_top_p(logits, batch.top_k, batch.top_p)
    elif batch.top_k is not None:
        logits = _top_k(logits, batch.top_k, batch.max_top_k)
    if batch.min_p is not None:
        probs = torch.softmax(logits, dim=-1)
        top = probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < batch.min_p.unsqueeze(1) * top, float("-inf"))
    return logits


def draw_in_one_pass(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """[N] token ids of every row in one pass over logits [N, V] (gumbel_argmax): a greedy row
    at temperature 0, a sampled row at its own, or at 1 once truncate has divided by it. Each
    sampled row draws its noise's seed: a seeded row from its own generator, one draw a step."""
    rows, device = batch.sample_rows, logits.device
    temperature = batch.temperature
    if batch.truncates:
        if batch.all_sampled:
            logits = truncate(logits, batch)
        else:
            logits[rows] = truncate(logits[rows], batch)
        temperature = None  # truncate divided by it
    temperature = torch.ones(len(rows), device=device) if temperature is None else temperature.squeeze(1)
    seeds = _random_like(rows, batch, torch.Tensor.random_)  # int64, as the row indices
    if not batch.all_sampled:  # scattered into every row; the greedy ones keep temperature 0
        temperature = torch.zeros(logits.shape[0], device=device).index_copy_(0, rows, temperature)
        seeds = torch.zeros(logits.shape[0], dtype=torch.int64, device=device).index_copy_(0, rows, seeds)
    return gumbel_argmax(logits, temperature, seeds)


def inverse_cdf(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """A token per row with probability softmax(logits), the CPU's way: an exponential per
    vocabulary entry costs the CPU 6x a softmax and a cumulative sum (0.87 against 0.15 ms a row
    at 49,152 tokens), so each row draws one uniform u and takes the first token whose
    cumulative probability exceeds u. A token of probability 0 never does (adding 0 leaves the
    sum where it was), and u stays below the row's total. A seeded row draws its u from its own
    generator."""
    cdf = torch.softmax(logits, dim=-1).cumsum_(dim=-1)
    total = cdf[:, -1:]
    u = _random_like(total, batch, torch.Tensor.uniform_)
    u = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


def _top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Keep each row's top_k largest logits (ties with the k-th are kept) without a full sort."""
    values = logits.topk(max_top_k, dim=-1).values                 # [S, max_top_k], descending
    kth = values.gather(1, (top_k.clamp(max=max_top_k) - 1).unsqueeze(1))
    kth = kth.masked_fill((top_k >= logits.shape[1]).unsqueeze(1), float("-inf"))  # top_k off
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[1], device=logits.device)
    if top_k is not None:
        sorted_logits = sorted_logits.masked_fill(rank >= top_k.unsqueeze(1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # Drop a token once the tokens ranked above it already hold top_p of the mass (so the first
    # always stays); rows with top_p == 1 are left alone, whatever rounding does to the cumsum.
    drop = (mass_before > top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _random_like(like: torch.Tensor, batch: SamplingBatch, fill) -> torch.Tensor:
    """A tensor shaped like `like`, filled in place by `fill` (torch.Tensor.uniform_,
    .random_): a seeded row draws from its own generator, the same count each step, so its
    tokens do not depend on what else is in the batch; the others share the default RNG."""
    out = torch.empty_like(like)
    if not batch.all_seeded:
        fill(out)
    for row, generator in batch.seeded:
        fill(out[row], generator=generator)
    return out


def _gather_logprobs(logprobs: torch.Tensor | None, token_ids: torch.Tensor,
                     max_num_logprobs: int | None) -> tuple:
    if logprobs is None:
        return None, None
    sampled = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    if max_num_logprobs == 0:
        return sampled, None
    top = logprobs.topk(max_num_logprobs, dim=-1)
    return sampled, (top.indices, top.values)
