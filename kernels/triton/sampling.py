"""gumbel_argmax: a program per (row, span of vocabulary blocks) keeps a running best score per
position, then the spans' bests are reduced in torch. Rows are split across more programs when
there are few of them, so one row's 128k logits are not read by a single SM."""
import torch
import triton
import triton.language as tl

_TARGET_PROGRAMS = 512  # a few waves on a 132-SM H200


@triton.jit
def _keep_best(row_ptr, token, u, vocab_size, t_safe, noise_scale, best, best_token):
    """Score QUARTER tokens with their uniforms u and keep the better per position. The noise is
    finite, so a -inf logit keeps a -inf score; a greedy row (t_safe 1, noise_scale 0) scores
    the logit itself."""
    x = tl.load(row_ptr + token, mask=token < vocab_size, other=float("-inf")).to(tl.float32)
    u = tl.maximum(u, 1.1754943508222875e-38)  # the smallest normal float: log(-log(u)) stays finite
    score = tl.math.div_rn(x, t_safe) - noise_scale * tl.log(-tl.log(u))
    better = score > best
    return tl.where(better, score, best), tl.where(better, token, best_token)


@triton.jit
def _gumbel_argmax_kernel(logits_ptr, temperature_ptr, seeds_ptr, best_score_ptr, best_token_ptr,
                          vocab_size, stride, blocks_per_split, num_splits, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    QUARTER: tl.constexpr = BLOCK // 4
    t = tl.load(temperature_ptr + row)
    seed = tl.load(seeds_ptr + row)
    t_safe = tl.where(t > 0, t, 1.0)
    noise_scale = tl.where(t > 0, 1.0, 0.0)
    i = tl.arange(0, QUARTER)
    best = tl.full([QUARTER], float("-inf"), tl.float32)
    best_token = tl.zeros([QUARTER], tl.int32)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(vocab_size, BLOCK))
    for block in range(first, last):
        start = block * BLOCK
        u0, u1, u2, u3 = tl.rand4x(seed, start // 4 + i)
        best, best_token = _keep_best(row_ptr, start + i, u0, vocab_size, t_safe, noise_scale,
                                      best, best_token)
        best, best_token = _keep_best(row_ptr, start + QUARTER + i, u1, vocab_size, t_safe, noise_scale,
                                      best, best_token)
        best, best_token = _keep_best(row_ptr, start + 2 * QUARTER + i, u2, vocab_size, t_safe, noise_scale,
                                      best, best_token)
        best, best_token = _keep_best(row_ptr, start + 3 * QUARTER + i, u3, vocab_size, t_safe, noise_scale,
                                      best, best_token)
    top = tl.max(best, axis=0)
    # the first of equal scores: the smallest token among the positions holding the top
    token = tl.min(tl.where(best == top, best_token, vocab_size), axis=0)
    tl.store(best_score_ptr + row * num_splits + split, top)
    tl.store(best_token_ptr + row * num_splits + split, token)


def gumbel_argmax_triton(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                         block: int) -> torch.Tensor:
    """As gdserve.kernels.sampling.gumbel_argmax (validated there); block is its NOISE_BLOCK."""
    num_rows, vocab_size = logits.shape
    num_blocks = triton.cdiv(vocab_size, block)
    want = max(1, min(num_blocks, _TARGET_PROGRAMS // max(num_rows, 1)))
    blocks_per_split = triton.cdiv(num_blocks, want)
    num_splits = triton.cdiv(num_blocks, blocks_per_split)
    if num_rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    best_score = torch.empty(num_rows, num_splits, dtype=torch.float32, device=logits.device)
    best_token = torch.empty(num_rows, num_splits, dtype=torch.int32, device=logits.device)
    _gumbel_argmax_kernel[(num_rows, num_splits)](
        logits, temperature, seeds, best_score, best_token, vocab_size, logits.stride(0),
        blocks_per_split, num_splits, BLOCK=block, num_warps=8)
    if num_splits == 1:
        return best_token.squeeze(1).long()
    return best_token.gather(1, best_score.argmax(dim=1, keepdim=True)).squeeze(1).long()
