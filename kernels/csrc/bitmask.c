/* Token-bitmask apply for the CPU: logits[row] = -inf where the token's bit is 0. One pass over
 * the packed words; a word of all ones (32 allowed tokens, most of a free-text row) skips its
 * logits without reading them; the others blend 32 logits with -inf in one vector pass. */
#include <stdint.h>

#define NEG_INF_F32 (-__builtin_inff())
#define NEG_INF_BF16 ((uint16_t)0xff80u)

#define APPLY(SUFFIX, T, NEG_INF)                                                                   \
void apply_token_bitmask_##SUFFIX(T *logits, long logits_stride, const int32_t *bitmask,           \
                                  long bitmask_stride, const int64_t *indices, long rows,           \
                                  long vocab, long words, int num_threads) {                       \
    _Pragma("omp parallel for num_threads(num_threads) schedule(static)")                          \
    for (long j = 0; j < rows; j++) {                                                              \
        T *row = logits + (indices ? indices[j] : j) * logits_stride;                              \
        const uint32_t *mask = (const uint32_t *)(bitmask + j * bitmask_stride);                   \
        long covered = words * 32 < vocab ? words * 32 : vocab;                                    \
        for (long w = 0; w * 32 < covered; w++) {                                                  \
            uint32_t word = mask[w];                                                               \
            if (word == 0xffffffffu) continue;                                                     \
            T *x = row + w * 32;                                                                   \
            if (w * 32 + 32 <= covered) {                                                          \
                _Pragma("omp simd")                                                                \
                for (int b = 0; b < 32; b++) x[b] = (word >> b) & 1u ? x[b] : NEG_INF;             \
            } else {                                                                               \
                for (int b = 0; b < covered - w * 32; b++) if (!((word >> b) & 1u)) x[b] = NEG_INF; \
            }                                                                                      \
        }                                                                                          \
        for (long i = covered; i < vocab; i++) row[i] = NEG_INF;  /* past the mask: disallowed */  \
    }                                                                                              \
}

APPLY(f32, float, NEG_INF_F32)
APPLY(bf16, uint16_t, NEG_INF_BF16)
