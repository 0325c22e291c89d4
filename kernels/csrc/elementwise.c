/* Row-wise kernels of the decoder layer for the CPU: residual add + RMSNorm, SiLU-and-mul.
 * Each replaces a chain of small torch ops (one pass over memory instead of 5-7), with the same
 * roundings as the torch reference: every intermediate the reference stores in the storage
 * type is rounded to it here too. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define T float
#define LOAD(x) (x)
#define STORE(x) (x)
#define SUFFIX f32
#include "elementwise.inc"
#undef T
#undef LOAD
#undef STORE
#undef SUFFIX

#define T uint16_t
#define LOAD(x) bf16_to_float(x)
#define STORE(x) float_to_bf16(x)
#define SUFFIX bf16
#include "elementwise.inc"
