/* Paged attention for single-token decodes on the CPU, reading K/V blocks in place.
 *
 * The torch reference gathers each sequence's blocks into a contiguous copy before attending;
 * at decode time that copy costs more than the attention itself. Here each sequence walks its
 * block table once for the scores and once for the values, reading every block in place.
 *
 * Layouts: q/out [S, H, D]; k_cache/v_cache [num_blocks, block_size, KVH, D]; block_tables
 * [S, max_blocks] int32; seq_lens [S] int32. Accumulation is float32 whatever the storage type.
 * Built at first use by gdserve.kernels.cpu_build (gcc -O3 -march=native -ffast-math -fopenmp).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>

#include "bf16.h"
/* Softmax weights of far-off tokens underflow to denormals, which cost ~100x per multiply on
 * x86: flush them to zero in this kernel's threads (and restore the caller's mode after). */
#define FTZ_DAZ_BEGIN unsigned int saved_csr = _mm_getcsr(); _mm_setcsr(saved_csr | 0x8040u);
#define FTZ_DAZ_END _mm_setcsr(saved_csr);
#else
#define FTZ_DAZ_BEGIN
#define FTZ_DAZ_END
#endif

/* Touch the next block while this one computes: block rows are contiguous, so the hardware
 * prefetcher alone would stall at every jump between a sequence's (scattered) blocks. */
static inline void prefetch_block(const void *p, long bytes) {
    for (long off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 1);
}

/* fp8 caches (e4m3fn, e5m2, as torch stores them) widen branch-free, so that a row's loop
 * vectorizes (a 256-entry table, which does not, measured slower): magnitude = mantissa (with its
 * implicit bit unless subnormal) times a power of two built as float bits, always a normal float
 * (the kernel runs with denormals flushed). The NaN/inf codes are never written (writes saturate). */
static inline float fp8_to_float(uint8_t b, int man_bits, int bias) {
    const uint32_t implicit = 1u << man_bits;
    const uint32_t e = (uint32_t)(b & 0x7f) >> man_bits, m = b & (implicit - 1);
    const uint32_t mantissa = e ? (m | implicit) : m, exponent = e ? e : 1;
    uint32_t pow2_bits = (exponent + 127 - bias - man_bits) << 23, bits;
    float pow2, v;
    memcpy(&pow2, &pow2_bits, sizeof pow2);
    v = (float)mantissa * pow2;
    memcpy(&bits, &v, sizeof bits);
    bits |= (uint32_t)(b >> 7) << 31;
    memcpy(&v, &bits, sizeof v);
    return v;
}

#define E4M3_TO_FLOAT(x) fp8_to_float((x), 3, 7)
#define E5M2_TO_FLOAT(x) fp8_to_float((x), 2, 15)

/* Each query type with a cache of its own type, of e4m3 and of e5m2. */
#define T float
#define LOAD(x) (x)
#define STORE(x) (x)
#define KV_T float
#define LOAD_KV(x) (x)
#define NAME paged_decode_attention_f32
#include "paged_decode_attention.inc"
#undef KV_T
#undef LOAD_KV
#undef NAME
#define KV_T uint8_t
#define LOAD_KV(x) E4M3_TO_FLOAT(x)
#define NAME paged_decode_attention_f32_e4m3
#include "paged_decode_attention.inc"
#undef LOAD_KV
#undef NAME
#define LOAD_KV(x) E5M2_TO_FLOAT(x)
#define NAME paged_decode_attention_f32_e5m2
#include "paged_decode_attention.inc"
#undef T
#undef LOAD
#undef STORE
#undef KV_T
#undef LOAD_KV
#undef NAME

#define T uint16_t
#define LOAD(x) bf16_to_float(x)
#define STORE(x) float_to_bf16(x)
#define KV_T uint16_t
#define LOAD_KV(x) bf16_to_float(x)
#define NAME paged_decode_attention_bf16
#include "paged_decode_attention.inc"
#undef KV_T
#undef LOAD_KV
#undef NAME
#define KV_T uint8_t
#define LOAD_KV(x) E4M3_TO_FLOAT(x)
#define NAME paged_decode_attention_bf16_e4m3
#include "paged_decode_attention.inc"
#undef LOAD_KV
#undef NAME
#define LOAD_KV(x) E5M2_TO_FLOAT(x)
#define NAME paged_decode_attention_bf16_e5m2
#include "paged_decode_attention.inc"
