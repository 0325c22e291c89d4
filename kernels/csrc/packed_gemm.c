/* The packed-weight GEMM for few rows (decode steps) on the CPU: out[M, N] = x[M, K] @ W with
 * W[k, n] = q[k, n] * scales[k / G, n] + biases[k / G, n], q read from the packed int32 words
 * (kernels/packed_gemm.py's PackedWeight). Per group the sums factor as
 * scales * (x . q) + biases * sum(x), so the inner loop is one multiply-add per weight, over a
 * block of columns wide enough to vectorize; threads split the columns. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define BLOCK_N 64  /* columns per task: 4 AVX-512 or 8 AVX2 registers a row */
#define BLOCK_M 8   /* rows summed together, each word unpacked once for all of them */

/* scales and biases: float, or bf16 where is_bf16 (read in place: widening them all first would
 * cost a third more memory traffic at group size 32). */
static void load_row(const void *src, long offset, int is_bf16, int width, float *dst) {
    if (is_bf16)
        for (int n = 0; n < width; n++) dst[n] = bf16_to_float(((const uint16_t *)src)[offset + n]);
    else
        memcpy(dst, (const float *)src + offset, width * sizeof(float));
}

/* x: [M, K] float, xsum: [M, K / G] float; out: [M, N] float. One block of columns. */
static void packed_gemm_block(const float *x, const float *xsum, const uint32_t *qweight, const void *scales,
                              const void *biases, int is_bf16, float *out, int M, int K, int N, int bits,
                              int group_size, int n0, int width) {
    const int per_word = 32 / bits, groups = K / group_size;
    const uint32_t mask = (1u << bits) - 1u;
    float acc[BLOCK_M][BLOCK_N], part[BLOCK_M][BLOCK_N], wq[BLOCK_N];
    for (int m0 = 0; m0 < M; m0 += BLOCK_M) {
        const int rows = M - m0 < BLOCK_M ? M - m0 : BLOCK_M;
        memset(acc, 0, sizeof acc);
        for (int g = 0; g < groups; g++) {
            memset(part, 0, sizeof part);
            for (int kw = g * group_size / per_word; kw < (g + 1) * group_size / per_word; kw++) {
                const uint32_t *words = qweight + (long)kw * N + n0;
                for (int j = 0; j < per_word; j++) {
                    const int shift = j * bits, k = kw * per_word + j;
                    #pragma omp simd
                    for (int n = 0; n < width; n++) wq[n] = (float)(int32_t)((words[n] >> shift) & mask);
                    for (int m = 0; m < rows; m++) {
                        const float xv = x[(long)(m0 + m) * K + k];
                        #pragma omp simd
                        for (int n = 0; n < width; n++) part[m][n] += xv * wq[n];
                    }
                }
            }
            float s[BLOCK_N], b[BLOCK_N];
            load_row(scales, (long)g * N + n0, is_bf16, width, s);
            load_row(biases, (long)g * N + n0, is_bf16, width, b);
            for (int m = 0; m < rows; m++) {
                const float xs = xsum[(long)(m0 + m) * groups + g];
                #pragma omp simd
                for (int n = 0; n < width; n++) acc[m][n] += part[m][n] * s[n] + xs * b[n];
            }
        }
        for (int m = 0; m < rows; m++) memcpy(out + (long)(m0 + m) * N + n0, acc[m], width * sizeof(float));
    }
}

static void packed_gemm_float(const float *x, const uint32_t *qweight, const void *scales, const void *biases,
                              int is_bf16, float *out, int M, int K, int N, int bits, int group_size, int num_threads) {
    const int groups = K / group_size;
    float *xsum = malloc(sizeof(float) * M * groups);
    for (int m = 0; m < M; m++)
        for (int g = 0; g < groups; g++) {
            float sum = 0.f;
            for (int k = g * group_size; k < (g + 1) * group_size; k++) sum += x[(long)m * K + k];
            xsum[m * groups + g] = sum;
        }
    const int blocks = (N + BLOCK_N - 1) / BLOCK_N;
    #pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int i = 0; i < blocks; i++) {
        const int n0 = i * BLOCK_N, width = N - n0 < BLOCK_N ? N - n0 : BLOCK_N;
        packed_gemm_block(x, xsum, qweight, scales, biases, is_bf16, out, M, K, N, bits, group_size, n0, width);
    }
    free(xsum);
}

void packed_gemm_f32(const float *x, const int32_t *qweight, const float *scales, const float *biases, float *out,
                     int M, int K, int N, int bits, int group_size, int num_threads) {
    packed_gemm_float(x, (const uint32_t *)qweight, scales, biases, 0, out, M, K, N, bits, group_size, num_threads);
}

static float *widen(const uint16_t *src, long n) {
    float *dst = malloc(sizeof(float) * n);
    for (long i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
    return dst;
}

/* bf16 operands: x widened to float once, the result rounded once. */
void packed_gemm_bf16(const uint16_t *x, const int32_t *qweight, const uint16_t *scales, const uint16_t *biases,
                      uint16_t *out, int M, int K, int N, int bits, int group_size, int num_threads) {
    const long out_n = (long)M * N;
    float *xf = widen(x, (long)M * K), *outf = malloc(sizeof(float) * out_n);
    packed_gemm_float(xf, (const uint32_t *)qweight, scales, biases, 1, outf, M, K, N, bits, group_size, num_threads);
    for (long i = 0; i < out_n; i++) out[i] = float_to_bf16(outf[i]);
    free(xf);
    free(outf);
}
