// Device helpers of every kernel, shared by the CUDA and HIP backends: element conversions, strided
// tensor offsets, the feature-map table, the gate prefix sums, grid-stride loops and CTA coordinates.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "expanse/backend.h"
#include "gpu/vendor.hpp"

namespace expanse_gpu {

// ------------------------------------------------------------------ element types
template <class T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<half_t>(half_t x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<bfloat16_t>(bfloat16_t x) { return bf16_to_f32(x); }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ half_t from_f32<half_t>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bfloat16_t from_f32<bfloat16_t>(float x) { return f32_to_bf16(x); }

// The 8 b16 elements of a 16-byte vector as floats (a vector loaded early, converted where used).
template <class T>
__device__ __forceinline__ void unpack8(uint4 u, float (&out)[8]) {
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = to_f32(e[j]);
}
// 8 consecutive elements of a b16 row (16-byte aligned) as floats.
template <class T>
__device__ __forceinline__ void load8(const T* src, float (&out)[8]) {
  unpack8<T>(*reinterpret_cast<const uint4*>(src), out);
}

// ------------------------------------------------------------------ strided tensors
// Offsets (in elements) into an expanse_tensor passed by value to a kernel.
__device__ __forceinline__ int64_t off3(const expanse_tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2];
}
__device__ __forceinline__ int64_t off4(const expanse_tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}
__device__ __forceinline__ int64_t off5(const expanse_tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3,
                                        int64_t i4) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3] + i4 * t.strides[4];
}
template <class T> __device__ __forceinline__ float load(const expanse_tensor& t, int64_t off) {
  return to_f32(static_cast<const T*>(t.data)[off]);
}
__device__ __forceinline__ float loadf(const expanse_tensor& t, int64_t off) {
  return static_cast<const float*>(t.data)[off];
}
__device__ __forceinline__ float* ptrf(const expanse_tensor& t, int64_t off) { return static_cast<float*>(t.data) + off; }
// Whether a 4-d b16 tensor's rows are whole 16-byte vectors (contiguous last dim, strides of 8
// elements, 16-byte aligned data), so that a thread can read or write 8 elements at once.
__host__ __device__ inline bool b16_vector_rows(const expanse_tensor& t) {
  return t.strides[3] == 1 && (t.strides[0] | t.strides[1] | t.strides[2]) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// ------------------------------------------------------------------ the feature map phi
// Row r of phi (docs/spec.md): phi_r(x) = coef * x[idx[0]] * ... * x[idx[p-1]]. Built once per call
// by build_phi_table (gpu/kernels/phi_table.hpp) for any layout, so kernels need no layout logic.
constexpr int kMaxDegree = 6;
struct phi_entry {
  float coef;
  uint16_t idx[kMaxDegree];
};
static_assert(sizeof(phi_entry) == 16, "phi_entry is 16 bytes");

// The symmetric layout at p = 2, for the kernels that take it as a d x d matrix: the row of (a, b),
// a <= b (the rows of every a' < a, then b - a), and its coefficient (sqrt 2 off the diagonal).
template <class I>
__host__ __device__ constexpr I sympow2_row(I d, I a, I b) { return a * d - a * (a - 1) / 2 + (b - a); }
template <class I>
__host__ __device__ constexpr float sympow2_coef(I a, I b) { return a == b ? 1.f : 1.4142135623730951f; }

// The same expansion seen as blocks of 64 rows with one shape, for the Hopper kernels that form phi
// from a few wide shared-memory loads (kernels/sm90/blocked_*): row 8 G + l (G, l < 8) of a block is
//   coef * x[fixed[0]] * x[fixed[1]] * x[mid + G] * x[last + l]      (a fixed index d is a factor of 1),
// mid and last multiples of 8. The tiled layout with d_tile 8 is such blocks as it stands (p >= 2);
// the symmetric layout is read through the tiled:8 rows that are non-decreasing multi-indices (the
// others are padding: row -1). Built by make_phi_tables (gpu/ops/common.cu).
struct phi_block {
  uint16_t fixed[2];
  uint16_t mid, last;
};
struct phi_block_row {
  int32_t row;  // the row of the layout, -1: padding
  float coef;   // 0 for padding
};
struct phi_blocks {
  const phi_block* block = nullptr;
  const phi_block_row* row = nullptr;  // 64 per block
  int64_t count = 0;                   // 0: the layout has no block form
};

template <class X>  // X(i) returns x_i as float
__device__ __forceinline__ float phi_value(const phi_entry& row, int p, X x) {
  float v = row.coef;
  for (int k = 0; k < p; ++k) v *= x(row.idx[k]);
  return v;
}

// The same in f64 with the coefficient exact: coef^2 is an integer (a multinomial count up to 6!) that
// the f32 coef gives to 1e-7. For sums that cancel (backward_simple.hpp, the denominators' state part).
template <class X>  // X(i) returns x_i as double
__device__ __forceinline__ double phi_value_f64(const phi_entry& row, int p, X x) {
  double v = sqrt(rint(double(row.coef) * double(row.coef)));
  for (int k = 0; k < p; ++k) v *= x(row.idx[k]);
  return v;
}

// The type a kernel sums phi(q) . S in for inputs of type T, where the terms have both signs and
// cancel far below their size: f64 for f32 inputs (f32 sums at p = 4 came out 1.1e-5 and 5e-5 off
// against the 1e-5 tolerance), f32 for b16 inputs, whose own rounding is larger.
template <class T>
using cancelling_sum_t = std::conditional_t<std::is_same_v<T, float>, double, float>;

// phi_r(x) in such a sum type: phi_value_f64 for double, phi_value for float.
template <class S, class X>
__device__ __forceinline__ S phi_value_as(const phi_entry& row, int p, X x) {
  if constexpr (std::is_same_v<S, double>) return phi_value_f64(row, p, [&](int i) { return double(x(i)); });
  else return phi_value(row, p, x);
}

// ------------------------------------------------------------------ gates
// Gate prefix sums inside chunks (gpu/kernels/chunk_gates.hpp), for a [b,t,h] log_g:
//   Gc [b,h,t]: inclusive cumulative sum of log_g inside each chunk (the queries' decay exp(Gc_i)),
//   total [b,h,n]: the chunk totals A_m (Gc at the chunk's last token; discumsum's decays).
// A reset (log_g = -inf, docs/spec.md) makes them -inf from there on, which exp() takes exactly,
// but differences of them would be -inf - (-inf). The differences are taken of sums that restart at
// resets instead:
//   restarted [b,h,t]: Gc restarted after each reset (finite), with last_reset [b,h,t] the chunk-local
//     index of the last reset at or before the token (-1: none): the decay from key j to query i is
//     exp(restarted_i - restarted_j) when j >= last_reset_i, else 0 (chunk_attention);
//   key_Gc [b,h,t], key_total [b,h,n]: restarted at the chunk's last reset, +inf for keys before it,
//     so that exp(key_total - key_Gc_j) is each key's decay to the chunk end (update_state; see keys()).
// All null when the op is not gated (every gate is then 1).
struct gates {
  const float* Gc = nullptr;
  const float* total = nullptr;
  const float* restarted = nullptr;
  const int32_t* last_reset = nullptr;
  const float* key_Gc = nullptr;
  const float* key_total = nullptr;
  // The view update_state's kernels read as (Gc, total): exp(total - Gc_j), reset-safe.
  __host__ __device__ gates keys() const {
    gates k;
    k.Gc = key_Gc;
    k.total = key_total;
    return k;
  }
  __device__ __forceinline__ float cum(int64_t bh, int64_t t_len, int64_t i) const {
    return Gc ? Gc[bh * t_len + i] : 0.f;
  }
  __device__ __forceinline__ float chunk_total(int64_t bh, int64_t n, int64_t m) const {
    return total ? total[bh * n + m] : 0.f;
  }
  // exp(A_m - Gc_j): key j's decay to the end of its chunk m (read on the keys() view); 1 without gates.
  __device__ __forceinline__ float to_chunk_end(int64_t bh, int64_t t_len, int64_t n, int64_t m, int64_t j) const {
    return Gc ? expf(chunk_total(bh, n, m) - cum(bh, t_len, j)) : 1.f;
  }
  // The sum restarted after resets, at token i (0 without gates).
  __device__ __forceinline__ float since_reset(int64_t bh, int64_t t_len, int64_t i) const {
    return restarted ? restarted[bh * t_len + i] : 0.f;
  }
  // Its address (null without gates), for asynchronous copies.
  __device__ __forceinline__ const float* since_reset_at(int64_t bh, int64_t t_len, int64_t i) const {
    return restarted ? restarted + bh * t_len + i : nullptr;
  }
  // The first chunk-local key whose decay to token i is not 0: the last reset at or before i, or the
  // chunk start.
  __device__ __forceinline__ int first_key(int64_t bh, int64_t t_len, int64_t i) const {
    return last_reset ? max(0, last_reset[bh * t_len + i]) : 0;
  }
};

// Grid-stride loop over [0, count).
#define EXPANSE_GRID_LOOP(i, count)                                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count);  \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// The sum of v over the thread's lane group (every lane gets it).
template <class V>
__device__ __forceinline__ V lane_group_sum(V v) {
  for (int o = kLaneGroup / 2; o > 0; o >>= 1) v += shfl_xor_group(v, o);
  return v;
}

// exp of the sum of term(j) over j in [lo, hi), summed by the block's first 32 threads and handed to
// every thread through `share` (a decay over chunks, loaded once per block rather than carried by
// each thread). Holds a barrier: every thread of the block calls it, and calls __syncthreads()
// before `share` is written again.
template <class Term>
__device__ __forceinline__ float block_exp_sum(int64_t lo, int64_t hi, Term term, float& share) {
  if (threadIdx.x < 32) {
    float sum = 0.f;
    for (int64_t j = lo + threadIdx.x; j < hi; j += 32) sum += term(j);
    for (int o = 16; o > 0; o >>= 1) sum += shfl_xor_group(sum, o);
    if (threadIdx.x == 0) share = expf(sum);
  }
  __syncthreads();
  return share;
}

// a / b for non-negative a, b, in 32-bit arithmetic where both fit: a 64-bit division is a long
// software routine on GPUs (three per row took most of the per-token kernels' instructions).
__device__ __forceinline__ int64_t quotient(int64_t a, int64_t b) {
  return a <= INT32_MAX && b <= INT32_MAX ? int64_t(uint32_t(a) / uint32_t(b)) : a / b;
}

// The (batch, token, head) of row `row` of a [b, t, heads] array.
struct token_row {
  int64_t batch, tok, head;
};
__device__ __forceinline__ token_row split_row(int64_t row, int64_t t, int64_t heads) {
  const int64_t rest = quotient(row, heads), batch = quotient(rest, t);
  return {batch, rest - batch * t, row - rest * heads};
}

inline unsigned grid_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 16 ? 65535 * 16 : blocks));
}

// ------------------------------------------------------------------ CTA coordinates
// The coordinates of a CTA of the chunked kernels, numbered
// blockIdx.x = ((batch * chunks + chunk) * heads + head) * tiles + tile.
struct cta_coords {
  int tile;
  int64_t head, chunk, batch;
};
// (Persistent kernels pass the number of the tile they take in place of blockIdx.x.)
__device__ __forceinline__ cta_coords decode_cta(int tiles, int64_t heads, int64_t chunks, int64_t cta) {
  cta_coords c;
  c.tile = static_cast<int>(cta % tiles);
  cta /= tiles;
  c.head = cta % heads;
  cta /= heads;
  c.chunk = cta % chunks;
  c.batch = cta / chunks;
  return c;
}
__device__ __forceinline__ cta_coords decode_cta(int tiles, int64_t heads, int64_t chunks) {
  return decode_cta(tiles, heads, chunks, blockIdx.x);
}

// The same grid (tiles CTAs for each chunk-head: a chunk of one head and batch) taken by rank within
// groups of `group` chunk-heads: the groups in turn, and in a group rank 0 of every chunk-head, then
// rank 1, ... The kernel maps the rank (returned as .tile) to its tile so that the tiles with the
// most work come first, and the host sizes the group so that the data of the CTAs in flight fits in
// L2 (chunk_heads_per_l2_group). Causal kernels need both: in plain order the longest tiles of the
// last heads start last (the tail), and over every chunk-head at once the CTAs in flight read their
// keys from DRAM (docs/performance.md, lesson 10).
__device__ __forceinline__ cta_coords decode_cta_by_rank(int tiles, int64_t heads, int64_t chunks, int64_t group) {
  const int64_t chunk_heads = int64_t(gridDim.x) / tiles, cta = blockIdx.x;
  const int64_t group_first = cta / (group * tiles) * group, in_group = min(group, chunk_heads - group_first);
  const int64_t r = cta - group_first * tiles;
  cta_coords at = decode_cta(1, heads, chunks, group_first + r % in_group);
  at.tile = static_cast<int>(r / in_group);
  return at;
}

// Chunk-heads per group of decode_cta_by_rank for kernels that read `bytes` per chunk-head: 16 MB,
// a third of the H100's L2, in flight.
inline int64_t chunk_heads_per_l2_group(int64_t bytes) {
  return std::max<int64_t>(1, (int64_t(16) << 20) / std::max<int64_t>(bytes, 1));
}

}  // namespace expanse_gpu
