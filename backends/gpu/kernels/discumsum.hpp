// discumsum: Y_0 = Y_init (or 0), Y_{m+1} = exp(A_m) Y_m + X_m, a streaming scan over chunks with
// the running state in an f32 register: one thread per state element, reading X once and writing Y
// once (memory bound; consecutive threads touch consecutive elements). Shared by the CUDA and HIP
// backends (vendor.hpp).
#pragma once

#include "expanse/expanse.h"
#include "gpu/vendor.hpp"

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

// X [b,n,h,...] of T, A [b,n,h] f32 (data may be null: no decay), init and fin [b,1,h,...] f32
// (data may be null), Y [b,n(+1),h,...] f32.
template <class T>
__global__ void discumsum_kernel(expanse_tensor X, expanse_tensor A, expanse_tensor init, expanse_tensor Y,
                                 expanse_tensor fin, int64_t n, int64_t elems) {
  const int64_t b = X.shape[0], h = X.shape[2];
  auto f32_at = [](const expanse_tensor& t, int64_t off) { return static_cast<float*>(t.data) + off; };
  EXPANSE_GPU_GRID_LOOP(i, b * h * elems) {
    const int64_t elem = i % elems, head = (i / elems) % h, batch = i / (elems * h);
    const int64_t xo = trailing_offset(X, X, elem), yo = trailing_offset(X, Y, elem);
    float y = init.data ? *f32_at(init, batch * init.strides[0] + head * init.strides[2] + trailing_offset(X, init, elem))
                        : 0.f;
    const T* xs = static_cast<const T*>(X.data) + batch * X.strides[0] + head * X.strides[2] + xo;
    float* ys = f32_at(Y, batch * Y.strides[0] + head * Y.strides[2] + yo);
    // Chunks go in groups: their X and A are loaded before any Y of the group is written, so the
    // loads overlap instead of waiting one by one (in place, Y_m overwrites X_m only after X_m was
    // read).
    for (int64_t m0 = 0; m0 < n; m0 += kDiscumsumAhead) {
      float x[kDiscumsumAhead], decay[kDiscumsumAhead];
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        const int64_t m = m0 + j;
        x[j] = m < n ? to_f32(xs[m * X.strides[1]]) : 0.f;
        decay[j] = m < n && A.data
                       ? expf(*f32_at(A, batch * A.strides[0] + m * A.strides[1] + head * A.strides[2]))
                       : 1.f;
      }
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        const int64_t m = m0 + j;
        // A break, not a guarded body: with `if (m < n) { ... }` nvcc's code made power_attention
        // 12% slower at t = 16384 and 18% at 65536 (H100, in place on f32 states).
        if (m >= n) break;
        ys[m * Y.strides[1]] = y;
        y = decay[j] * y + x[j];
      }
    }
    if (fin.data) *f32_at(fin, batch * fin.strides[0] + head * fin.strides[2] + trailing_offset(X, fin, elem)) = y;
  }
}

// Enqueues the scan of n chunks of X into Y on `stream`: for m < n, Y_m (the state entering chunk m)
// goes to Y's slot m and Y_n to final_state (when its data is non-null). X and Y may be the same
// memory (in place). init has X's rank with a size-1 chunk axis (data null: 0).
inline void launch_discumsum(const expanse_tensor& X, const expanse_tensor& A, const expanse_tensor& init,
                             const expanse_tensor& Y, const expanse_tensor& final_state, int64_t n, int32_t input_dtype,
                             stream_t stream) {
  int64_t elems = 1;
  for (int dim = 3; dim < X.ndim; ++dim) elems *= X.shape[dim];
  const int64_t work = X.shape[0] * X.shape[2] * elems;
  if (work == 0) return;
  with_input_type(input_dtype, [&](auto tag) {
    using T = decltype(tag);
    discumsum_kernel<T><<<grid_for(work, 256), 256, 0, stream>>>(X, A, init, Y, final_state, n, elems);
  });
  check_launch("discumsum");
}

// A [b,h,...] state as a [b,1,h,...] view (discumsum's init/final form); empty when absent.
inline expanse_tensor with_chunk_axis(const expanse_tensor* s) {
  expanse_tensor t{};
  if (s == nullptr) return t;
  t = *s;
  t.ndim = s->ndim + 1;
  t.shape[0] = s->shape[0];
  t.strides[0] = s->strides[0];
  t.shape[1] = 1;
  t.strides[1] = 0;
  for (int i = 1; i < s->ndim; ++i) {
    t.shape[i + 1] = s->shape[i];
    t.strides[i + 1] = s->strides[i];
  }
  return t;
}

// The operation discumsum (a validated problem with n chunks): Y[:, n] is the final state.
inline void run_discumsum(const expanse_discumsum_args& a, int64_t n, int32_t input_dtype, stream_t stream) {
  expanse_tensor fin = *a.Y;  // slot n of Y
  fin.data = static_cast<float*>(a.Y->data) + n * a.Y->strides[1];
  launch_discumsum(*a.X, *a.A, with_chunk_axis(a.Y_init), *a.Y, fin, n, input_dtype, stream);
}

}  // namespace expanse_gpu
