"""Token bitmasks for guided decoding: allocation, packing (numpy words) and the apply (Triton on
CUDA, native C on the CPU, the torch reference elsewhere).

Layout (xgrammar's and llguidance's): int32 [batch, ceil(V / 32)]; token i is bit i % 32 of word
i // 32, little-endian within the word, so token 32k + 31 is the sign bit. A set bit allows it.
"""
import ctypes

import numpy as np
import torch

from gdserve.kernels import native
from gdserve.kernels.triton import use_triton


def bitmask_width(vocab_size: int) -> int:
    """Words in one bitmask row: ceil(vocab_size / 32)."""
    return (vocab_size + 31) // 32


def empty_words(vocab_size: int) -> np.ndarray:
    """uint32 [bitmask_width(vocab_size)], every bit clear: no token allowed."""
    return np.zeros(bitmask_width(vocab_size), dtype=np.uint32)


def set_bits(words: np.ndarray, ids) -> None:
    """In place: allow tokens ids (ints, repeats fine) in packed uint32 words."""
    word, bit = _word_and_bit(ids)
    np.bitwise_or.at(words, word, bit)


def clear_bits(words: np.ndarray, ids) -> None:
    """In place: disallow tokens ids (ints, repeats fine) in packed uint32 words."""
    word, bit = _word_and_bit(ids)
    np.bitwise_and.at(words, word, ~bit)


def _word_and_bit(ids) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ids, dtype=np.int64)
    return ids >> 5, np.uint32(1) << (ids & 31).astype(np.uint32)


def is_allowed(row, token: int) -> bool:
    """Whether token's bit is set in one bitmask row (int32 [W]: a tensor or an array)."""
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


def unpack_words(words: np.ndarray, n: int) -> np.ndarray:
    """bool [n] of packed 32-bit words (n <= 32 * len(words)): pack_words undone."""
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


def pack_words(allowed: np.ndarray, vocab_size: int) -> np.ndarray:
    """uint32 [bitmask_width(vocab_size)]: bit i % 32 of word i // 32 set where allowed[i] (bool,
    at most vocab_size long: the rest stays clear)."""
    bits = np.zeros(32 * bitmask_width(vocab_size), dtype=bool)
    bits[:len(allowed)] = allowed
    return np.packbits(bits, bitorder="little").view("<u4").astype(np.uint32)


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """int32 [batch_size, ceil(vocab_size / 32)], every token allowed (-1 = all 32 bits set)."""
    return torch.full((batch_size, bitmask_width(vocab_size)), -1, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [M, vocab_size] from int32 [M, W]; tokens past W * 32 are disallowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1                        # [M, W, 32]
    allowed = bits.flatten(1).bool()                                    # [M, W * 32]
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    return torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]), value=False)


@torch.inference_mode()  # logits from an inference_mode forward may only be updated inside it
def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                        indices: torch.Tensor | None = None) -> None:
    """In place, logits[r] = -inf where the token's bit is 0.

    logits: float [N, V]; bitmask: int32 [M, W]. Without indices, logits row i takes bitmask row i
    (M >= N); with indices, logits row indices[j] takes bitmask row j. V may be below W * 32 (the
    tail is ignored) or above it (tokens past W * 32 are disallowed).
    """
    num_rows = logits.shape[0] if indices is None else indices.shape[0]
    if bitmask.shape[0] < num_rows:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {num_rows} logits rows")
    if use_triton(logits, "bitmask") and logits.stride(1) == 1:
        from gdserve.kernels.triton.bitmask import apply_token_bitmask_triton
        bitmask = bitmask.to(logits.device, non_blocking=True).contiguous()
        indices = None if indices is None else indices.to(logits.device, non_blocking=True)
        return apply_token_bitmask_triton(logits, bitmask, indices)
    kernel = native.kernel("apply_token_bitmask", logits)
    if kernel is not None and logits.stride(1) == 1:
        bitmask = bitmask.contiguous()
        indices = None if indices is None else indices.to(torch.int64).contiguous()
        if indices is not None and num_rows and not 0 <= int(indices.min()) <= int(indices.max()) < logits.shape[0]:
            raise IndexError(f"indices must lie in [0, {logits.shape[0]}): the logits' rows")
        long = ctypes.c_long
        kernel(native.ptr(logits), long(logits.stride(0)), native.ptr(bitmask), long(bitmask.stride(0)),
               None if indices is None else native.ptr(indices), long(num_rows), long(logits.shape[1]),
               long(bitmask.shape[1]), torch.get_num_threads())
        return
    apply_token_bitmask_reference(logits, bitmask, indices)


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor,
                                  indices: torch.Tensor | None = None) -> None:
    """apply_token_bitmask in torch ops (the portable path)."""
    num_rows = logits.shape[0] if indices is None else indices.shape[0]
    disallowed = ~unpack_bitmask(bitmask[:num_rows].to(logits.device), logits.shape[1])
    if indices is None:
        logits.masked_fill_(disallowed, float("-inf"))
    else:
        indices = indices.to(logits.device)
        logits[indices] = logits[indices].masked_fill(disallowed, float("-inf"))
