"""Device experiment: decode attention with the cache tile as the dots' first operand ("swap
AB": s^T = K q^T, out^T = V^T p^T), so a widened fp8 tile can feed the tensor cores from
registers, against the engine's kernel, for a bf16 and an fp8 cache at batch 256, context 1024
(one split). Usage: python3 scripts/decode_variants_gpu.py (prints JSON lines; also runs under
TRITON_INTERPRET=1 on the CPU at a small shape, as a correctness check).
Session 25 measured the swap faster (bf16 cache 0.283 against 0.331 ms, fp8 0.227 against 0.248;
best tile 64 tokens, 2 warps, 4 stages). The engine's kernel rewritten that way (5771442) failed
at real shapes for a compile error: its tile loader had two `return`s of different shapes under a
constexpr `if`, which the compiler refuses and the interpreter takes (tests/kernels/
test_sm90_compile.py now catches that in CI). Fixed, it passed every test, but timed against the
engine's kernel in one process (session 27) it was no faster over bf16 (1.12x over fp8) and the
engine ran 0.7% slower with it, so it stayed out; this script keeps the experiment."""
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))


@triton.jit
def _swapped_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, seq_lens_ptr, out_ptr, scale_log2,
                           stride_qs, stride_qh, stride_os, stride_oh, stride_tab, stride_cb, stride_ct, stride_ch,
                           GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                           PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_TYPE: tl.constexpr):
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM)
    q_t = tl.load(q_ptr + seq * stride_qs + heads[None, :] * stride_qh + d[:, None],
                  mask=g[None, :] < GROUP, other=0.0).to(DOT_TYPE)          # [D, G]
    table_row = tables_ptr + seq.to(tl.int64) * stride_tab
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc_t = tl.zeros([HEAD_DIM, GROUP_PAD], tl.float32)                     # out^T
    for n0 in range(0, seq_len, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        valid = tok < seq_len
        page = tl.load(table_row + tok // PAGE, mask=valid, other=0).to(tl.int64)
        row = page * stride_cb + (tok % PAGE) * stride_ct + kv_head * stride_ch
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_TYPE)
        s_t = tl.dot(k, q_t) * scale_log2                                  # [N, G]
        s_t = tl.where(valid[:, None], s_t, float("-inf"))
        m_new = tl.maximum(m, tl.max(s_t, 0))
        alpha = tl.exp2(m - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        v_t = tl.load(v_cache_ptr + row[None, :] + d[:, None], mask=valid[None, :], other=0.0).to(DOT_TYPE)
        acc_t = acc_t * alpha[None, :] + tl.dot(v_t, p_t.to(DOT_TYPE))     # [D, N] @ [N, G]
        l = l * alpha + tl.sum(p_t, 0)
        m = m_new
    out_t = acc_t / l[None, :]
    tl.store(out_ptr + seq * stride_os + heads[None, :] * stride_oh + d[:, None],
             out_t.to(out_ptr.dtype.element_ty), mask=g[None, :] < GROUP)


def swapped_decode(q, k_cache, v_cache, tables, lens, scale, block_n=64, num_warps=4, num_stages=2):
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    fp8 = k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    dot_type = tl.float16 if fp8 else (tl.bfloat16 if q.dtype == torch.bfloat16 else tl.float32)
    group = num_heads // num_kv_heads
    _swapped_decode_kernel[(num_seqs, num_kv_heads)](
        q, k_cache, v_cache, tables, lens, out, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, PAGE=page,
        BLOCK_N=block_n, DOT_TYPE=dot_type, num_warps=num_warps, num_stages=num_stages)
    return out


def main() -> None:
    on_cuda = torch.cuda.is_available()
    if on_cuda:
        import test_gpu
        test_gpu.setup_imports()
    from gdserve.kernels.paged_attention import decode_attention_reference
    from gdserve.kernels.triton.paged_attention import decode_attention_triton
    for kv_dtype in (None, torch.float8_e4m3fn):
        if on_cuda:
            q, k_cache, v_cache, tables, lens, kv_bytes = test_gpu.decode_case(256, 1024, kv_dtype=kv_dtype)
            context, batch = 1024, 256
        else:  # interpreter: float32 queries (its dot takes bf16 bits as integers)
            batch, context, page = 3, 40, 16
            g = torch.Generator().manual_seed(0)
            nb = batch * 3 + 2
            k_cache = torch.randn(nb, page, 2, 64, generator=g).to(kv_dtype or torch.float32)
            v_cache = torch.randn(nb, page, 2, 64, generator=g).to(kv_dtype or torch.float32)
            q = torch.randn(batch, 8, 64, generator=g)
            tables = torch.randperm(nb, generator=g)[:batch * 3].view(batch, 3).int()
            lens = torch.tensor([40, 17, 33], dtype=torch.int32)
            kv_bytes = 0
        scale = q.shape[-1] ** -0.5
        ref = decode_attention_reference(q, k_cache, v_cache, tables, lens, lens.tolist(), scale).float()
        name = "bf16" if kv_dtype is None else "fp8"
        err = (swapped_decode(q, k_cache, v_cache, tables, lens, scale, **({} if on_cuda else dict(block_n=16)))
               .float() - ref).abs().max().item()
        print(json.dumps({"cache": name, "swapped_max_abs_err": err}), flush=True)
        if not on_cuda:
            continue
        base = test_gpu.median_ms(lambda: decode_attention_triton(q, k_cache, v_cache, tables, lens, context, scale))
        kernel = lambda **tile: swapped_decode(q, k_cache, v_cache, tables, lens, scale, **tile)
        rows = test_gpu.sweep_tiles(kernel, ref, kv_bytes, (32, 64, 128), (2, 4, 8), (2, 3, 4))
        rows.sort(key=lambda r: r["ms"])
        print(json.dumps({"cache": name, "engine_kernel_ms": round(base, 4),
                          "engine_kernel_gbs": round(kv_bytes / base / 1e6, 1), "swapped_best": rows[:5]}), flush=True)


if __name__ == "__main__":
    main()
