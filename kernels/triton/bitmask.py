"""Token-bitmask apply over the batch: logits[row] = -inf where the token's bit is 0."""
import torch
import triton
import triton.language as tl


@triton.jit
def _apply_bitmask_kernel(logits_ptr, bitmask_ptr, indices_ptr, vocab_size, num_words,
                          stride_l, stride_b, HAS_INDICES: tl.constexpr, BLOCK: tl.constexpr):
    j = tl.program_id(0)
    row = j
    if HAS_INDICES:
        row = tl.load(indices_ptr + j)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    word = tokens // 32
    words = tl.load(bitmask_ptr + j * stride_b + word, mask=word < num_words, other=0)
    allowed = ((words >> (tokens % 32)) & 1) != 0
    # Store only the disallowed: allowed logits are never read or written.
    tl.store(logits_ptr + row.to(tl.int64) * stride_l + tokens, float("-inf"),
             mask=(tokens < vocab_size) & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                               indices: torch.Tensor | None = None, block: int = 4096) -> None:
    """As gdserve.kernels.apply_token_bitmask (validated there); bitmask on logits' device."""
    num_rows = logits.shape[0] if indices is None else indices.shape[0]
    assert logits.stride(1) == 1 and bitmask.stride(1) == 1 and bitmask.dtype == torch.int32
    if num_rows == 0:
        return
    grid = (num_rows, triton.cdiv(logits.shape[1], block))
    _apply_bitmask_kernel[grid](logits, bitmask, bitmask if indices is None else indices,
                                logits.shape[1], bitmask.shape[1], logits.stride(0), bitmask.stride(0),
                                HAS_INDICES=indices is not None, BLOCK=block)
