// discumsum: Y_0 = Y_init (or 0), Y_{m+1} = exp(A_m) Y_m + X_m, a streaming scan over chunks with
// the running state in an f32 register: one thread per state element, reading X once and writing Y
// once (memory bound; consecutive threads touch consecutive elements).
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

constexpr int kDiscumsumAhead = 8;  // chunks whose loads are in flight together

// Offset of trailing element `elem` (row-major over dims 3..) in a tensor shaped like X.
__device__ __forceinline__ int64_t trailing_offset(const expanse_tensor& shape_of, const expanse_tensor& t,
                                                   int64_t elem) {
  int64_t off = 0;
  for (int dim = shape_of.ndim - 1; dim >= 3; --dim) {
    const int64_t i = elem % shape_of.shape[dim];
    elem /= shape_of.shape[dim];
    off += i * t.strides[dim];
  }
  return off;
}

template <class T>
__global__ void discumsum_kernel(expanse_tensor X, expanse_tensor A, expanse_tensor init, expanse_tensor Y,
                                 expanse_tensor fin, int64_t n, int64_t elems) {
  const int64_t b = X.shape[0], h = X.shape[2];
  EXPANSE_GRID_LOOP(i, b * h * elems) {
    const int64_t elem = i % elems, head = (i / elems) % h, batch = i / (elems * h);
    const int64_t xo = trailing_offset(X, X, elem), yo = trailing_offset(X, Y, elem);
    float y = init.data ? *ptrf(init, batch * init.strides[0] + head * init.strides[2] + trailing_offset(X, init, elem)) : 0.f;
    const T* xs = static_cast<const T*>(X.data) + batch * X.strides[0] + head * X.strides[2] + xo;
    float* ys = static_cast<float*>(Y.data) + batch * Y.strides[0] + head * Y.strides[2] + yo;
    // Chunks go in groups of kDiscumsumAhead: their X and A are loaded before any Y of the group is
    // written, so the loads overlap instead of waiting one by one (in place, Y_m overwrites X_m
    // only after X_m was read).
    for (int64_t m0 = 0; m0 < n; m0 += kDiscumsumAhead) {
      float x[kDiscumsumAhead], decay[kDiscumsumAhead];
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        const int64_t m = m0 + j;
        x[j] = m < n ? to_f32(xs[m * X.strides[1]]) : 0.f;
        decay[j] = m < n && A.data ? expf(*ptrf(A, off3(A, batch, m, head))) : 1.f;
      }
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        const int64_t m = m0 + j;
        // A break, not a guarded body: with `if (m < n) { ... }` nvcc's code made power_attention
        // 12% slower at t = 16384 and 18% at 65536 (H100, in place on f32 states). clang does not
        // unroll this loop because of the break (hipcc -Wno-pass-failed), which AMD tuning may revisit.
        if (m >= n) break;
        ys[m * Y.strides[1]] = y;
        y = decay[j] * y + x[j];
      }
    }
    if (fin.data) *ptrf(fin, batch * fin.strides[0] + head * fin.strides[2] + trailing_offset(X, fin, elem)) = y;
  }
}

// After a scan from zero (expanse_power_attention_exchange: the initial state arrives later), its share
// of the state entering each chunk: Y_m += exp(A_0 + ... + A_{m-1}) init, in place; init has Y's rank
// with a size-1 chunk axis, A may be absent (no decay). A block per (batch, head, chunk): its first 32
// threads sum the decay to the chunk, then every thread adds to its entries. Every (chunk, entry) is
// independent, so the pass runs at the memory's rate; a thread per entry carrying the decay along
// the chunks (a dependent chain of loads per thread) took 4.3 ms instead of about 0.5 at 1M tokens
// of P1 on an H200. Zeros of init (rank 0 of context parallelism) are skipped. kDense: Y's and init's
// entries are contiguous, at `elem` (the workspace states); otherwise found per entry by divisions.
constexpr int kAddInitialThreads = 256;
template <bool kDense>
__global__ void add_initial_kernel(expanse_tensor Y, expanse_tensor A, expanse_tensor init,
                                                           int64_t n, int64_t elems) {
  const int64_t h = Y.shape[2], blocks = Y.shape[0] * h * n;
  __shared__ float share;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t m = blk % n, head = (blk / n) % h, batch = blk / (n * h);
    const float decay =
        block_exp_sum(0, A.data ? m : 0, [&](int64_t j) { return *ptrf(A, off3(A, batch, j, head)); }, share);
    if (decay != 0.f) {  // zero after a reset
      float* ys = ptrf(Y, batch * Y.strides[0] + m * Y.strides[1] + head * Y.strides[2]);
      const int64_t init_at = batch * init.strides[0] + head * init.strides[2];
      for (int64_t elem = threadIdx.x; elem < elems; elem += blockDim.x) {
        const float x = *ptrf(init, init_at + (kDense ? elem : trailing_offset(Y, init, elem)));
        if (x != 0.f) ys[kDense ? elem : trailing_offset(Y, Y, elem)] += decay * x;
      }
    }
    __syncthreads();  // `share` is written again for the next block
  }
}

}  // namespace expanse_gpu
