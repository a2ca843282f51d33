// Gate prefix sums inside chunks (the `gates` of gpu/kernels/common.hpp): per token Gc, the sums
// restarted at resets, the last reset and the keys' view; per chunk the totals. Summed in f64 so that
// differences keep f32 accuracy even deep into long chunks, where both terms are large.
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

constexpr int kChunkGatesThreads = 1024;  // one chunk per head at short t: the block is all the parallelism

// A run of tokens as a segmented-scan element: the sum since the run's last reset (or its start),
// and that reset's chunk-local index (-1: none in the run).
struct run_sum {
  double sum;
  int64_t last_reset;
};
// `before` then `after`: a reset in `after` cuts everything before it.
__device__ __forceinline__ run_sum then(run_sum before, run_sum after) {
  return after.last_reset >= 0 ? after : run_sum{before.sum + after.sum, before.last_reset};
}

// Where the kernel writes the arrays of `gates`.
struct gate_arrays {
  float *Gc, *restarted, *key_Gc, *total, *key_total;
  int32_t* last_reset;
};

// One block per (chunk, head, batch): each thread sums a run of consecutive tokens, a block scan
// of the run sums gives each run what comes before it, then each thread writes its run.
__global__ void __launch_bounds__(kChunkGatesThreads) chunk_gates_kernel(expanse_tensor log_g, int64_t t, int64_t h, int64_t c, int64_t n, gate_arrays out) {
  __shared__ double run_sums[kChunkGatesThreads];
  __shared__ int64_t run_resets[kChunkGatesThreads];
  const int64_t m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int64_t first = m * c, len = min(c, t - first);
  const int64_t per = (len + kChunkGatesThreads - 1) / kChunkGatesThreads;
  const int64_t begin = min(len, threadIdx.x * per), end = min(len, begin + per);
  const float* g = static_cast<const float*>(log_g.data);
  auto step = [](run_sum acc, float x, int64_t i) {
    return x == -INFINITY ? run_sum{0.0, i} : run_sum{acc.sum + x, acc.last_reset};
  };
  run_sum mine{0.0, -1};
  for (int64_t i = begin; i < end; ++i) mine = step(mine, g[off3(log_g, batch, first + i, head)], i);
  run_sums[threadIdx.x] = mine.sum;
  run_resets[threadIdx.x] = mine.last_reset;
  __syncthreads();
  for (int stride = 1; stride < kChunkGatesThreads; stride *= 2) {  // inclusive Hillis-Steele scan
    run_sum combined{run_sums[threadIdx.x], run_resets[threadIdx.x]};
    if (threadIdx.x >= stride)
      combined = then(run_sum{run_sums[threadIdx.x - stride], run_resets[threadIdx.x - stride]}, combined);
    __syncthreads();
    run_sums[threadIdx.x] = combined.sum;
    run_resets[threadIdx.x] = combined.last_reset;
    __syncthreads();
  }
  const run_sum chunk{run_sums[kChunkGatesThreads - 1], run_resets[kChunkGatesThreads - 1]};
  run_sum acc = threadIdx.x > 0 ? run_sum{run_sums[threadIdx.x - 1], run_resets[threadIdx.x - 1]} : run_sum{0.0, -1};
  const int64_t row = (batch * h + head) * t + first;
  for (int64_t i = begin; i < end; ++i) {
    acc = step(acc, g[off3(log_g, batch, first + i, head)], i);
    const float sum = static_cast<float>(acc.sum);
    out.Gc[row + i] = acc.last_reset >= 0 ? -INFINITY : sum;
    out.restarted[row + i] = sum;
    out.last_reset[row + i] = static_cast<int32_t>(acc.last_reset);
    out.key_Gc[row + i] = i >= chunk.last_reset ? sum : INFINITY;
  }
  if (threadIdx.x == kChunkGatesThreads - 1) {
    const int64_t at = (batch * h + head) * n + m;
    out.total[at] = chunk.last_reset >= 0 ? -INFINITY : static_cast<float>(chunk.sum);
    out.key_total[at] = static_cast<float>(chunk.sum);
  }
}

}  // namespace expanse_gpu
