/* Multi-LoRA deltas for the CPU, token by token (BGMV), in one call for all shards of a layer.
 *
 * The torch path runs a few small matmuls per adapter and shard; at decode sizes each costs more
 * in dispatch than in arithmetic (bfloat16's oneDNN calls ~20 us each), and a step with the
 * adapters interleaved needs one such chain per adapter. Here every token reads its slot's A and
 * B in place (they stay in cache across the tokens that share them).
 *
 * Layouts: x [T, K], y [T, N] (row strides given); lora_a [slots, shards, R, K] and lora_b
 * [slots, N, R] contiguous; token_slots [T] int32 (-1: no adapter); shard_ends[i]: the column
 * where shard i ends. h: float32 scratch [T, shards * R]. Sums in float32; y rounded once.
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define T float
#define LOAD(x) (x)
#define STORE(x) (x)
#define SUFFIX f32
#include "lora.inc"
#undef T
#undef LOAD
#undef STORE
#undef SUFFIX

#define T uint16_t
#define LOAD(x) bf16_to_float(x)
#define STORE(x) float_to_bf16(x)
#define SUFFIX bf16
#include "lora.inc"
