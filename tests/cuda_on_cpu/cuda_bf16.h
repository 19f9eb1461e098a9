// The CPU build's stand-in for CUDA's cuda_bf16.h: __half, __nv_bfloat16 and their conversions are in
// cuda_cpu.h.
#include "cuda_cpu.h"
