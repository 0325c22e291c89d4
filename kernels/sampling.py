"""A token per row drawn from softmax(logits / temperature) in one pass over the logits, by the
Gumbel-max trick: argmax(logit / T - log E), E ~ Exp(1), with E = -log(u) for a counter-based
(Philox) uniform u keyed by the row's seed and the token's position, so no noise tensor is ever
written. Temperature 0 takes the argmax. A token whose logit is -inf is never drawn.

The noise of token t is lane k of Philox counter (c / 4 + i), where c = t - t % NOISE_BLOCK is its
block's first token and t = c + k * NOISE_BLOCK / 4 + i: Triton's rand4x over a block's counters.
The reference draws the same noise, so both give the same token for the same seed.
"""
import torch

from gdserve.kernels.triton import use_triton

NOISE_BLOCK = 2048  # tokens per block of Philox counters (4 uniforms per counter)

# Philox-4x32-10, as triton.language.random
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_MASK32 = 0xFFFFFFFF
_INT32_TO_UNIFORM = 4.6566127342e-10  # the largest scale keeping (2**31 - 1) * scale below 1


def gumbel_argmax(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """logits: float [N, V]; temperature: float32 [N] (0: greedy); seeds: int64 [N] -> int64 [N]."""
    num_rows = logits.shape[0]
    if logits.dim() != 2 or temperature.shape != (num_rows,) or seeds.shape != (num_rows,):
        raise ValueError(f"logits must be [N, V] with temperature and seeds [N]; got {tuple(logits.shape)}, "
                         f"{tuple(temperature.shape)}, {tuple(seeds.shape)}")
    if seeds.dtype != torch.int64:
        raise ValueError(f"seeds must be int64, got {seeds.dtype}")
    if use_triton(logits, "sample") and logits.stride(1) == 1:
        from gdserve.kernels.triton.sampling import gumbel_argmax_triton
        return gumbel_argmax_triton(logits, temperature.float(), seeds, NOISE_BLOCK)
    return gumbel_argmax_reference(logits, temperature, seeds)


def gumbel_argmax_reference(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """gumbel_argmax in torch ops (the portable path); the first of equal scores wins."""
    scores = logits.float().clone()
    sampled = (temperature > 0).nonzero().squeeze(1)
    if sampled.numel():
        u = philox_uniforms(seeds[sampled], logits.shape[1])
        # the noise is finite: a -inf logit keeps a -inf score
        scores[sampled] = scores[sampled] / temperature[sampled].float().unsqueeze(1) - torch.log(-torch.log(u))
    return scores.argmax(dim=-1)


def philox_uniforms(seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [R, vocab_size]: token t's uniform for each row's seed, in (0, 1) (a draw of 0 is
    raised to the smallest normal float, so log(-log(u)) stays finite)."""
    quarter = NOISE_BLOCK // 4
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    within = tokens % NOISE_BLOCK
    counters = (tokens - within) // 4 + within % quarter
    lanes = torch.stack(_philox(seeds.unsqueeze(1), counters.unsqueeze(0)), dim=-1)  # [R, V, 4]
    words = lanes.gather(2, (within // quarter).expand(seeds.shape[0], -1).unsqueeze(2)).squeeze(2)
    signed = torch.where(words >= 1 << 31, words - (1 << 32), words)     # the int32 bit pattern
    magnitude = torch.where(signed < 0, -signed - 1, signed).to(torch.int32)
    u = magnitude.float() * _INT32_TO_UNIFORM
    return u.clamp_min_(torch.finfo(torch.float32).tiny)


def _philox(seeds: torch.Tensor, counters: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Philox-4x32-10 of counters (c, 0, 0, 0) under key (seed low word, seed high word), in
    int64 arithmetic on 32-bit values; broadcasts seeds against counters."""
    c0 = counters & _MASK32
    c1 = torch.zeros_like(c0)
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0 = seeds & _MASK32
    k1 = (seeds >> 32) & _MASK32
    for _ in range(10):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def _mul_hi_lo(a: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The high and low 32-bit words of a * x (a, x < 2**32) without overflowing int64: x is
    split into 16-bit halves, so each partial product stays below 2**48."""
    high_part = a * (x >> 16)
    low_part = a * (x & 0xFFFF)
    hi = (high_part + (low_part >> 16)) >> 16
    lo = (((high_part & 0xFFFF) << 16) + low_part) & _MASK32
    return hi, lo
