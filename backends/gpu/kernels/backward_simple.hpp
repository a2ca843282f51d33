// The SIMT kernels of the backward operations (docs/spec.md "Gradients"), any shape and dtype with d
// and e up to kBackwardMaxDim. One block per token for the per-token work (its vectors in shared
// memory, block-wide sums); the state cotangents like update_state_simple, one thread per entry.
//   backward_cotangents_kernel      dnum_i, dden_i of each query token (den_i recomputed)
//   query_cotangent_states_kernel   X_m = sum_{heads, i in m} exp(Gc_i) phi(scale q_i) [dnum_i | dden_i]^T
//   reverse_scan_kernel             dY_m = exp(A_m) dY_{m+1} + X_m: slot m keeps dY_{m+1}; dinitial = dY_0
//   final_cotangent_kernel          dfinal's share added after a scan from zero (exchanging backward)
//   boundary_sums_kernel            each chunk's boundary term <dY_{m+1}, S_{m+1}> for the gates
//   query_gradients_kernel          dq (the state term and/or the causal pairs), and q . dq
//   key_gradients_kernel            dk, dv (likewise), and k . dk
//   gate_gradients_kernel           dlog_g: the segmented reverse cumsum of dG_i = (sum_heads q.dq - k.dk) / p
//                                   inside each chunk, from the chunk's boundary term
//   chunk_gate_gradients_kernel     the same inside each chunk, for the core operations
//   the rest: rowmax's scaling of chunk_attention's cotangents, discumsum's reverse scan
// phi is homogeneous of degree p, so phi(x) . dphi(x) = x . dx / p: the gates' gradients come from
// the dot products of the inputs with their gradients.
#pragma once
// (The kernels that are not templates are static, so that every file that includes this header has its
// own, and maybe unused.)

#include "gpu/kernels/common.hpp"
#include "gpu/kernels/discumsum.hpp"  // trailing_offset

namespace expanse_gpu {

constexpr int kBackwardMaxDim = 256;   // d and e: a token's vectors sit in shared memory
constexpr int kBackwardThreads = 128;  // per block: whole lane groups
constexpr int kBackwardGroups = kBackwardThreads / kLaneGroup;

// The tensors of a backward call (data null where absent). l, rowmax: query_state's intra term.
// dq, dk, dv in any float dtype (store_any).
struct backward_tensors {
  expanse_tensor q, k, v, o, dout, l, rowmax, dq, dk, dv;
};

// The states and their cotangents, f32 [b,n,h,D,e] and [b,n,h,D] (data null where absent): S, z enter
// each chunk (the forward's); dY, dZ are what chunk m's keys see (the state leaving it).
struct backward_states {
  expanse_tensor S, z, dY, dZ;
};

// Workspace arrays, f32 and contiguous.
struct backward_work {
  float *dnum, *dden;  // [b,t,hq,e] (null where not wanted), [b,t,hq]: the cotangents of each query's numerator, denominator
  float *qdq, *kdk;    // [b,t,hq], [b,t,h]: q . dq and k . dk
  float* rden;         // [b,t,hq]: 1 / den_i (0 where den_i = 0), where wanted (else null)
};

// What a backward takes into account: the causal pairs inside the chunks (power_attention,
// chunk_attention), query_state's intra term in the denominator.
struct backward_form {
  int pairs, intra;
  // power_attention_backward, normalized: M_ij = dnum_i . v_j + dden_i taken as r_i dout_i . (v_j - o_i)
  // from the inputs (w.rden, in.o), and the state's S_m dnum_i + z_m dden_i as r_i (S_m - z_m o_i^T)
  // dout_i: both cancel, and for a query that sees one key the first is exactly 0 (with the rounded
  // dnum and dden it was eps |dout| |v| / den_i, which a tiny denominator made dq's largest term).
  int exact = 0;
};

// Stores v into element `off` of a f32, f16 or bf16 tensor.
__device__ __forceinline__ void store_any(const expanse_tensor& t, int64_t off, float v) {
  if (t.dtype == EXPANSE_F32) static_cast<float*>(t.data)[off] = v;
  else if (t.dtype == EXPANSE_F16) static_cast<half_t*>(t.data)[off] = from_f32<half_t>(v);
  else static_cast<bfloat16_t*>(t.data)[off] = from_f32<bfloat16_t>(v);
}

// The sum of v over the block (every thread gets it). scratch: kBackwardGroups + 1 floats.
template <class V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
  v = lane_group_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (threadIdx.x % kLaneGroup == 0) scratch[threadIdx.x / kLaneGroup] = v;
  __syncthreads();
  V s = 0;
  for (int g = 0; g < kBackwardGroups; ++g) s += scratch[g];
  return s;
}

__device__ __forceinline__ float ipowf(float x, int p) {
  float r = 1.f;
  for (int i = 0; i < p; ++i) r *= x;
  return r;
}

// sum_dim a[dim] * x(dim) for one thread.
template <class X>
__device__ __forceinline__ float dot_with(const float* a, int64_t n, X x) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * x(i);
  return s;
}

// s_ij = scale q_i . k_j from the unscaled q (float) and k (X(dim)), summed in f64 and scaled after: a
// nearly orthogonal pair (a query whose only key is its own, after a reset or at a chunk's start)
// makes the sum cancel by 1e3, and its tiny denominator then makes its gradients the largest, so an
// f32 sum of a rounded scale q left dq 4e-5 off on a case of the table (tolerance 1e-5).
template <class X>
__device__ __forceinline__ float scaled_dot(const float* q, int64_t n, X k, double scale) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(q[i]) * double(k(i));
  return float(scale * s);
}

// Adds w * J_phi(x)^T e_row (row `row` of phi's pullback) to acc, in shared memory, in A's precision
// (f64: with the coefficient exact, as phi_value_f64 takes it).
template <class A>
__device__ __forceinline__ void add_pullback(const phi_entry& row, int p, const float* x, A w, A* acc) {
  const A coef = sizeof(A) == sizeof(double) ? A(sqrt(rint(double(row.coef) * double(row.coef)))) : A(row.coef);
  for (int f = 0; f < p; ++f) {
    A others = w * coef;
    for (int g2 = 0; g2 < p; ++g2)
      if (g2 != f) others *= x[row.idx[g2]];
    atomicAdd(&acc[row.idx[f]], others);
  }
}

// One block per (batch, token, query head): den_i = [the state's] + [the pairs'] + [the intra term],
// then dnum_i, dden_i.
template <class T>
__global__ void backward_cotangents_kernel(backward_tensors in, backward_states st, backward_work w, gates g,
                                           const phi_entry* table, expanse_problem pb, backward_form form) {
  __shared__ float qs[kBackwardMaxDim], qu[kBackwardMaxDim], scratch[kBackwardGroups + 1];
  __shared__ double scratch64[kBackwardGroups + 1];
  const int64_t qh = blockIdx.x % pb.hq, i = (blockIdx.x / pb.hq) % pb.t, batch = blockIdx.x / (pb.hq * pb.t);
  const int64_t kv = qh / (pb.hq / pb.h), bh = batch * pb.h + kv, m = i / pb.c, row = blockIdx.x;
  for (int64_t x = threadIdx.x; x < pb.d; x += blockDim.x) {
    qu[x] = load<T>(in.q, off4(in.q, batch, i, qh, x));
    qs[x] = float(pb.scale) * qu[x];
  }
  __syncthreads();
  float den = 1.f, dd = 0.f;
  if (pb.normalize) {
    float part = 0.f;
    if (st.z.data) {
      // phi(scale q_i) . z_m in f64 from the unscaled q_i with exact coefficients: z_m's entries have
      // both signs, and for a query nearly orthogonal to the keys behind z_m the sum cancels (by 1e4 on
      // a case of the table, where f32 left dq 1e-4 off in the Kokkos backend, tolerance 1e-5).
      double state = 0.0, scale_p = 1.0;
      for (int k = 0; k < pb.p; ++k) scale_p *= pb.scale;
      for (int64_t r = threadIdx.x; r < pb.D; r += blockDim.x)
        state += phi_value_f64(table[r], pb.p, [&](int x) { return double(qu[x]); }) * loadf(st.z, off4(st.z, batch, m, kv, r));
      state = block_sum(state, scratch64);
      if (threadIdx.x == 0) part = float(scale_p * state) * expf(g.cum(bh, pb.t, i));
    }
    if (form.pairs) {
      const float ri = g.since_reset(bh, pb.t, i);
      for (int64_t j = m * pb.c + g.first_key(bh, pb.t, i) + threadIdx.x; j <= i; j += blockDim.x) {
        const float dot = scaled_dot(qu, pb.d, [&](int64_t x) { return load<T>(in.k, off4(in.k, batch, j, kv, x)); }, pb.scale);
        part += ipowf(dot, pb.p) * expf(ri - g.since_reset(bh, pb.t, j));
      }
    }
    den = block_sum(part, scratch);
    if (form.intra)
      den += loadf(in.l, off3(in.l, batch, i, qh)) * expf(loadf(in.rowmax, off3(in.rowmax, batch, i, qh)));
    float od = 0.f;
    for (int64_t y = threadIdx.x; y < pb.e; y += blockDim.x)
      od += load<T>(in.dout, off4(in.dout, batch, i, qh, y)) * load<T>(in.o, off4(in.o, batch, i, qh, y));
    od = block_sum(od, scratch);
    dd = den == 0.f ? 0.f : -od / den;
  }
  for (int64_t y = threadIdx.x; y < pb.e; y += blockDim.x)
    w.dnum[row * pb.e + y] = den == 0.f ? 0.f : load<T>(in.dout, off4(in.dout, batch, i, qh, y)) / den;
  if (threadIdx.x == 0) {
    w.dden[row] = dd;
    if (w.rden) w.rden[row] = den == 0.f ? 0.f : 1.f / den;
  }
}

// One thread per entry (batch, chunk, kv head, row r, column) of st.dY (column e: st.dZ, if present).
template <class T>
__global__ void query_cotangent_states_kernel(expanse_tensor q, backward_states st, backward_work w, gates g,
                                              const phi_entry* table, expanse_problem pb) {
  const int64_t cols = pb.e + 1, group = pb.hq / pb.h;
  EXPANSE_GRID_LOOP(idx, pb.b * pb.n * pb.h * pb.D * cols) {
    const int64_t col = idx % cols;
    int64_t rest = idx / cols;
    const int64_t r = rest % pb.D;
    rest /= pb.D;
    const int64_t kv = rest % pb.h;
    rest /= pb.h;
    const int64_t m = rest % pb.n, batch = rest / pb.n;
    if (col == pb.e && !st.dZ.data) continue;
    const int64_t first = m * pb.c, len = min(pb.c, pb.t - first), bh = batch * pb.h + kv;
    const phi_entry row = table[r];
    float acc = 0.f;
    for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh)
      for (int64_t s = 0; s < len; ++s) {
        const int64_t i = first + s, tok = (batch * pb.t + i) * pb.hq + qh;
        const float decay = expf(g.cum(bh, pb.t, i));
        if (decay == 0.f) continue;
        const float ph = phi_value(row, pb.p, [&](int x) { return float(pb.scale) * load<T>(q, off4(q, batch, i, qh, x)); });
        acc += decay * ph * (col < pb.e ? w.dnum[tok * pb.e + col] : w.dden[tok]);
      }
    if (col < pb.e) *ptrf(st.dY, off5(st.dY, batch, m, kv, r, col)) = acc;
    else *ptrf(st.dZ, off4(st.dZ, batch, m, kv, r)) = acc;
  }
}

// What the reverse scan starts from and ends in (data null where absent): the cotangents of the final
// state, the gradients of the initial one, and the final state itself (for the last chunk's boundary term).
struct scan_ends {
  expanse_tensor dfinal_S, dfinal_z, dinitial_S, dinitial_z;
  const float* S_final;  // [b,h,D,e] f32 contiguous
  const float* z_final;  // [b,h,D]
};

// One state entry of a kv head (its D*e entries, then the D of z).
struct state_entry {
  bool in, is_z;
  int64_t r, col;
  __device__ __forceinline__ state_entry(int64_t entry, int64_t per_head, const expanse_problem& pb) {
    const int64_t De = pb.D * pb.e;
    in = entry < per_head, is_z = entry >= De;
    r = is_z ? entry - De : quotient(entry, pb.e), col = is_z ? 0 : entry - r * pb.e;
  }
};

// The reverse scan over st.dY, st.dZ, and, where `boundary` is set, each chunk's boundary term (see
// boundary_sums_kernel) added to boundary [b,h,n] (f64, zeroed). A block per kScanEntries x
// kBackwardThreads entries of one kv head, each thread carrying kScanEntries entries (strided by the
// block's width) down the chunks. Chunk m's input X_m is read from Xs, Xz ([b,n,H,D,e], [b,n,H,D]; the
// H / h heads of a kv head summed) or, where their data is null, from st.dY, st.dZ in place. Each
// step's inputs, decay and forward state are loaded a step ahead (before the store, which they might
// alias), so that a thread has 2 kScanEntries loads in flight. The boundary terms sum the entries'
// dY_{m+1} S_{m+1} in f64 by lane group, keep the block's partials of kScanFlush chunks in shared
// memory and add them out once per kScanFlush chunks: with a block barrier per chunk this pass took
// 0.88 ms at P1 t = 65536 (H100), and a pass of its own after the scan 0.62 ms.
constexpr int kScanEntries = 4, kScanFlush = 32;
[[maybe_unused]] static __global__ void __launch_bounds__(kBackwardThreads)
    reverse_scan_kernel(backward_states st, expanse_tensor Xs, expanse_tensor Xz, scan_ends ends, gates g,
                        expanse_problem pb, double* boundary) {
  __shared__ double partial[kScanFlush][kBackwardGroups];
  constexpr int kBlockEntries = kScanEntries * kBackwardThreads;
  const int64_t De = pb.D * pb.e, per_head = De + (st.dZ.data ? pb.D : 0);
  const int64_t tiles = (per_head + kBlockEntries - 1) / kBlockEntries, head = quotient(blockIdx.x, tiles);
  const int64_t first_entry = (blockIdx.x - head * tiles) * kBlockEntries + threadIdx.x;
  const int64_t kv = head % pb.h, batch = head / pb.h;
  // Per entry: its slot in chunk 0 and the stride between chunks; its input's (first query head) and
  // the stride between query heads; the forward state's.
  float* slot[kScanEntries];
  const float *src[kScanEntries], *fwd[kScanEntries];
  int64_t slot_sn[kScanEntries], src_sn[kScanEntries], src_sh[kScanEntries], fwd_sn[kScanEntries];
  float cur[kScanEntries], s_final[kScanEntries];
  bool in[kScanEntries];
  const int64_t group = Xs.data ? Xs.shape[2] / pb.h : 1;
#pragma unroll
  for (int k = 0; k < kScanEntries; ++k) {
    const state_entry at(first_entry + k * kBackwardThreads, per_head, pb);
    in[k] = at.in;
    slot[k] = nullptr, src[k] = fwd[k] = nullptr, cur[k] = s_final[k] = 0.f;
    slot_sn[k] = src_sn[k] = src_sh[k] = fwd_sn[k] = 0;
    if (!at.in) continue;
    const expanse_tensor &dY = at.is_z ? st.dZ : st.dY, &X = at.is_z ? Xz : Xs, &S = at.is_z ? st.z : st.S;
    auto entry_offset = [&](const expanse_tensor& t, int64_t chunk, int64_t hd) {
      return at.is_z ? off4(t, batch, chunk, hd, at.r) : off5(t, batch, chunk, hd, at.r, at.col);
    };
    slot[k] = ptrf(dY, entry_offset(dY, 0, kv)), slot_sn[k] = dY.strides[1];
    if (X.data) src[k] = ptrf(X, entry_offset(X, 0, kv * group)), src_sn[k] = X.strides[1], src_sh[k] = X.strides[2];
    if (boundary && S.data) fwd[k] = ptrf(S, entry_offset(S, 0, kv)), fwd_sn[k] = S.strides[1];
    if (!at.is_z && ends.dfinal_S.data) cur[k] = *ptrf(ends.dfinal_S, off4(ends.dfinal_S, batch, kv, at.r, at.col));
    if (at.is_z && ends.dfinal_z.data) cur[k] = *ptrf(ends.dfinal_z, off3(ends.dfinal_z, batch, kv, at.r));
    if (boundary && !at.is_z && ends.S_final) s_final[k] = ends.S_final[head * De + at.r * pb.e + at.col];
    if (boundary && at.is_z && ends.z_final) s_final[k] = ends.z_final[head * pb.D + at.r];
  }
  auto input = [&](int k, int64_t m) {  // X_m
    if (!src[k]) return slot[k][m * slot_sn[k]];
    float x = 0.f;
    for (int64_t j = 0; j < group; ++j) x += src[k][m * src_sn[k] + j * src_sh[k]];
    return x;
  };
  float x_next[kScanEntries], s_next[kScanEntries];  // X_m and S_{m+1} for the next step m
#pragma unroll
  for (int k = 0; k < kScanEntries; ++k) {
    x_next[k] = in[k] && pb.n > 0 ? input(k, pb.n - 1) : 0.f;
    s_next[k] = s_final[k];
  }
  // A_m, loaded a step ahead and exponentiated where used (exponentiated where loaded, it made the
  // thread wait for it there, before the step's other loads: a third of the stall samples, ncu at P1
  // t = 65536).
  float total_next = pb.n > 0 ? g.chunk_total(head, pb.n, pb.n - 1) : 0.f;
  for (int64_t m = pb.n - 1; m >= 0; --m) {
    float x[kScanEntries], s[kScanEntries];
    const float decay = expf(total_next);
#pragma unroll
    for (int k = 0; k < kScanEntries; ++k) x[k] = x_next[k], s[k] = s_next[k];
    if (m > 0) {
      total_next = g.chunk_total(head, pb.n, m - 1);
#pragma unroll
      for (int k = 0; k < kScanEntries; ++k) {
        if (!in[k]) continue;
        x_next[k] = input(k, m - 1);
        s_next[k] = fwd[k] ? fwd[k][m * fwd_sn[k]] : 0.f;  // S_m, which chunk m - 1's boundary meets
      }
    }
    double part = 0.0;
#pragma unroll
    for (int k = 0; k < kScanEntries; ++k) {
      if (!in[k]) continue;
      slot[k][m * slot_sn[k]] = cur[k];  // dY_{m+1}: what chunk m's keys see
      part += double(s[k]) * double(cur[k]);
      cur[k] = decay * cur[k] + x[k];
    }
    if (!boundary) continue;
    part = lane_group_sum(part);
    if (threadIdx.x % kLaneGroup == 0) partial[m % kScanFlush][threadIdx.x / kLaneGroup] = part;
    if (m % kScanFlush == 0) {  // chunks m .. m + kScanFlush - 1 are complete
      __syncthreads();
      if (threadIdx.x < kScanFlush && m + threadIdx.x < pb.n) {
        double sum = 0.0;
        for (int w = 0; w < kBackwardGroups; ++w) sum += partial[threadIdx.x][w];
        if (sum != 0.0) atomicAdd(boundary + head * pb.n + m + threadIdx.x, sum);
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int k = 0; k < kScanEntries; ++k) {
    if (!in[k]) continue;
    const state_entry at(first_entry + k * kBackwardThreads, per_head, pb);
    if (!at.is_z && ends.dinitial_S.data) *ptrf(ends.dinitial_S, off4(ends.dinitial_S, batch, kv, at.r, at.col)) = cur[k];
    if (at.is_z && ends.dinitial_z.data) *ptrf(ends.dinitial_z, off3(ends.dinitial_z, batch, kv, at.r)) = cur[k];
  }
}

// After a reverse scan that started from zero (expanse_power_attention_backward_exchange: dfinal
// arrives later), dfinal's share, the scan being linear in its start: slot m (dY_{m+1}) +=
// exp(A_{m+1} + ... + A_{n-1}) dfinal and dinitial += exp(A_0 + ... + A_{n-1}) dfinal. A block per
// (kv head, slot m or, as m = n, dinitial, `per_block` entries of the head), over the grid: its first
// 32 threads sum the decay once, then every (slot, entry) is independent. A thread per entry
// carrying the decay down the chunks (a dependent chain of loads per thread) took 3.8 ms at 1M tokens
// of P1 on an H200. The launcher makes per_block grow with n, so that the decay's sum (up to n
// loads) never outweighs the block's entries.
[[maybe_unused]] static __global__ void __launch_bounds__(kBackwardThreads)
    final_cotangent_kernel(backward_states st, scan_ends ends, gates g, expanse_problem pb, int64_t per_block) {
  __shared__ float share;
  const int64_t per_head = pb.D * pb.e + (st.dZ.data ? pb.D : 0);
  const int64_t tiles = (per_head + per_block - 1) / per_block, blocks = tiles * pb.b * pb.h * (pb.n + 1);
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t rest = quotient(blk, tiles), tile = blk - rest * tiles;
    const int64_t head = quotient(rest, pb.n + 1), m = rest - head * (pb.n + 1);
    const int64_t kv = head % pb.h, batch = head / pb.h;
    const float decay = block_exp_sum(m == pb.n ? 0 : m + 1, pb.n, [&](int64_t j) { return g.chunk_total(head, pb.n, j); },
                                      share);
    const int64_t end = decay == 0.f ? 0 : min(per_head, (tile + 1) * per_block);  // 0: a reset after the slot
    for (int64_t entry = tile * per_block + threadIdx.x; entry < end; entry += kBackwardThreads) {
      const state_entry at(entry, per_head, pb);
      float dfinal = 0.f;
      if (!at.is_z && ends.dfinal_S.data) dfinal = *ptrf(ends.dfinal_S, off4(ends.dfinal_S, batch, kv, at.r, at.col));
      if (at.is_z && ends.dfinal_z.data) dfinal = *ptrf(ends.dfinal_z, off3(ends.dfinal_z, batch, kv, at.r));
      if (dfinal == 0.f) continue;
      float* slot = nullptr;
      if (m < pb.n)
        slot = at.is_z ? ptrf(st.dZ, off4(st.dZ, batch, m, kv, at.r)) : ptrf(st.dY, off5(st.dY, batch, m, kv, at.r, at.col));
      else if (!at.is_z && ends.dinitial_S.data)
        slot = ptrf(ends.dinitial_S, off4(ends.dinitial_S, batch, kv, at.r, at.col));
      else if (at.is_z && ends.dinitial_z.data)
        slot = ptrf(ends.dinitial_z, off3(ends.dinitial_z, batch, kv, at.r));
      if (slot) *slot += decay * dfinal;
    }
    __syncthreads();  // `share` is written again for the next block
  }
}

// After launch_final_cotangent (the exchanging backward: the plain reverse scan sums them as it goes),
// one block per (kv head, chunk m, kBoundaryEntries entries of the head):
// boundary [b,h,n] (zeroed) += <dY_{m+1}, S_{m+1}> + <dZ_{m+1}, z_{m+1}> over its entries (slot m of
// st.dY, st.dZ against slot m + 1 of st.S, st.z; S_n the final state, 0 where there is none): the
// sum over the pairs that straddle the chunk's end of their gates' gradient, which
// gate_gradients_kernel starts each chunk from.
constexpr int kBoundaryEntries = 8 * kBackwardThreads;
[[maybe_unused]] static __global__ void __launch_bounds__(kBackwardThreads)
    boundary_sums_kernel(backward_states st, scan_ends ends, expanse_problem pb, double* boundary) {
  __shared__ double scratch[kBackwardGroups + 1];  // f64: the term cancels against the chunk's q . dq - k . dk
  const int64_t De = pb.D * pb.e, per_head = De + (st.dZ.data ? pb.D : 0);
  const int64_t tiles = (per_head + kBoundaryEntries - 1) / kBoundaryEntries, rest = quotient(blockIdx.x, tiles);
  const int64_t tile = blockIdx.x - rest * tiles, head = quotient(rest, pb.n), m = rest - head * pb.n;
  const int64_t kv = head % pb.h, batch = head / pb.h;
  double sum = 0.0;
  for (int64_t entry = tile * kBoundaryEntries + threadIdx.x; entry < min(per_head, (tile + 1) * kBoundaryEntries);
       entry += kBackwardThreads) {
    const state_entry at(entry, per_head, pb);
    float next = 0.f;  // the state entering chunk m + 1
    if (m + 1 < pb.n) next = at.is_z ? *ptrf(st.z, off4(st.z, batch, m + 1, kv, at.r)) : *ptrf(st.S, off5(st.S, batch, m + 1, kv, at.r, at.col));
    else if (at.is_z && ends.z_final) next = ends.z_final[head * pb.D + at.r];
    else if (!at.is_z && ends.S_final) next = ends.S_final[head * De + entry];
    if (next != 0.f)
      sum += double(next) * (at.is_z ? *ptrf(st.dZ, off4(st.dZ, batch, m, kv, at.r)) : *ptrf(st.dY, off5(st.dY, batch, m, kv, at.r, at.col)));
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0 && sum != 0.0) atomicAdd(boundary + head * pb.n + m, sum);
}

// One block per (batch, token, query head): dq from the state entering the chunk (st.S) and/or the
// causal pairs (form.pairs); q . dq to w.qdq.
template <class T>
__global__ void query_gradients_kernel(backward_tensors in, backward_states st, backward_work w, gates g,
                                       const phi_entry* table, expanse_problem pb, backward_form form) {
  __shared__ float qs[kBackwardMaxDim], qu[kBackwardMaxDim], dnum[kBackwardMaxDim];
  __shared__ float douts[kBackwardMaxDim], os[kBackwardMaxDim];  // form.exact: dout_i, o_i
  // dq summed in f64: the state's term cancels (S_m dout_i against z_m dout_i . o_i, then D products
  // of J_phi^T), and in f32 it left dq 9.2e-6 off on a case of the table (tolerance 1e-5).
  __shared__ double acc[kBackwardMaxDim], scratch64[kBackwardGroups + 1];
  const int64_t qh = blockIdx.x % pb.hq, i = (blockIdx.x / pb.hq) % pb.t, batch = blockIdx.x / (pb.hq * pb.t);
  const int64_t kv = qh / (pb.hq / pb.h), bh = batch * pb.h + kv, m = i / pb.c, row = blockIdx.x;
  for (int64_t x = threadIdx.x; x < pb.d; x += blockDim.x) {
    qu[x] = load<T>(in.q, off4(in.q, batch, i, qh, x));
    qs[x] = float(pb.scale) * qu[x];
    acc[x] = 0.0;
  }
  for (int64_t y = threadIdx.x; y < pb.e; y += blockDim.x) {
    dnum[y] = w.dnum[row * pb.e + y];
    if (form.exact) {
      douts[y] = load<T>(in.dout, off4(in.dout, batch, i, qh, y));
      os[y] = load<T>(in.o, off4(in.o, batch, i, qh, y));
    }
  }
  __syncthreads();
  const float dden = w.dden[row], rden = form.exact ? w.rden[row] : 0.f;
  if (st.S.data) {  // dphi_r = exp(Gc_i) (S_m[r] . dnum + z_m[r] dden)
    const float decay = expf(g.cum(bh, pb.t, i));
    for (int64_t r = threadIdx.x; decay != 0.f && r < pb.D; r += blockDim.x) {
      double u = 0.0;
      if (form.exact && st.z.data) {
        const double zr = loadf(st.z, off4(st.z, batch, m, kv, r));
        for (int64_t y = 0; y < pb.e; ++y) u += double(douts[y]) * (loadf(st.S, off5(st.S, batch, m, kv, r, y)) - zr * os[y]);
        u *= rden;
      } else {
        for (int64_t y = 0; y < pb.e; ++y) u += double(dnum[y]) * loadf(st.S, off5(st.S, batch, m, kv, r, y));
        if (st.z.data) u += double(loadf(st.z, off4(st.z, batch, m, kv, r))) * dden;
      }
      if (u != 0.0) add_pullback(table[r], pb.p, qs, double(decay) * u, acc);
    }
  }
  if (form.pairs) {  // B_ij scale k_j
    const float ri = g.since_reset(bh, pb.t, i);
    for (int64_t j = m * pb.c + g.first_key(bh, pb.t, i) + threadIdx.x; j <= i; j += blockDim.x) {
      auto kj = [&](int64_t x) { return load<T>(in.k, off4(in.k, batch, j, kv, x)); };
      auto vj = [&](int64_t y) { return load<T>(in.v, off4(in.v, batch, j, kv, y)); };
      const float dot = scaled_dot(qu, pb.d, kj, pb.scale);
      const float mv = form.exact ? rden * dot_with(douts, pb.e, [&](int64_t y) { return vj(y) - os[y]; })
                                  : dot_with(dnum, pb.e, vj) + dden;
      const float B = pb.p * ipowf(dot, pb.p - 1) * expf(ri - g.since_reset(bh, pb.t, j)) * mv;
      if (B != 0.f)
        for (int64_t x = 0; x < pb.d; ++x) atomicAdd(&acc[x], double(B) * kj(x));
    }
  }
  __syncthreads();
  double qdq = 0.0;  // q . dq from the f64 sums (dlog_g takes q . dq - k . dk, which cancel)
  for (int64_t x = threadIdx.x; x < pb.d; x += blockDim.x) {
    store_any(in.dq, off4(in.dq, batch, i, qh, x), float(pb.scale * acc[x]));
    qdq += double(qu[x]) * acc[x];
  }
  qdq = block_sum(qdq, scratch64);
  if (threadIdx.x == 0) w.qdq[row] = float(pb.scale * qdq);
}

// One block per (batch, token, kv head): dk, dv from the state cotangent chunk j's key sees (st.dY)
// and/or the causal pairs with the chunk's later queries (form.pairs); k . dk to w.kdk.
template <class T>
__global__ void key_gradients_kernel(backward_tensors in, backward_states st, backward_work w, gates g,
                                     const phi_entry* table, expanse_problem pb, backward_form form) {
  __shared__ float kk[kBackwardMaxDim], vv[kBackwardMaxDim], accv[kBackwardMaxDim];
  // dk summed in f64, as dq is: k . dk - q . dq cancel in dlog_g (an f32 dk left it 1.4e-5 off, once
  // in about 300 seeds, on the table's f32 case of one token with initial and final states).
  __shared__ double acck[kBackwardMaxDim], scratch64[kBackwardGroups + 1];
  const int64_t kv = blockIdx.x % pb.h, j = (blockIdx.x / pb.h) % pb.t, batch = blockIdx.x / (pb.h * pb.t);
  const int64_t bh = batch * pb.h + kv, m = j / pb.c, first = m * pb.c, last = min(first + pb.c, pb.t) - 1;
  const int64_t group = pb.hq / pb.h;
  for (int64_t x = threadIdx.x; x < pb.d; x += blockDim.x) kk[x] = load<T>(in.k, off4(in.k, batch, j, kv, x)), acck[x] = 0.0;
  for (int64_t y = threadIdx.x; y < pb.e; y += blockDim.x) vv[y] = load<T>(in.v, off4(in.v, batch, j, kv, y)), accv[y] = 0.f;
  __syncthreads();
  if (st.dY.data) {  // dphi_r = exp(A_m - Gc_j) (dY[r] . v_j + dZ[r])
    const float decay = g.keys().to_chunk_end(bh, pb.t, pb.n, m, j);
    for (int64_t r = threadIdx.x; decay != 0.f && r < pb.D; r += blockDim.x) {
      double u = 0.0;
      for (int64_t y = 0; y < pb.e; ++y) u += double(vv[y]) * loadf(st.dY, off5(st.dY, batch, m, kv, r, y));
      if (st.dZ.data) u += loadf(st.dZ, off4(st.dZ, batch, m, kv, r));
      if (u != 0.0) add_pullback(table[r], pb.p, kk, double(decay) * u, acck);
    }
    for (int64_t y = threadIdx.x; decay != 0.f && y < pb.e; y += blockDim.x) {
      float s = 0.f;
      for (int64_t r = 0; r < pb.D; ++r)
        s += loadf(st.dY, off5(st.dY, batch, m, kv, r, y)) * phi_value(table[r], pb.p, [&](int x) { return kk[x]; });
      accv[y] += decay * s;
    }
  }
  __syncthreads();
  if (form.pairs) {  // the causal pairs with the later queries of the chunk (every query head of the kv head)
    const float rj = g.since_reset(bh, pb.t, j);
    for (int64_t pair = threadIdx.x; pair < (last - j + 1) * group; pair += blockDim.x) {
      const int64_t i = j + pair / group, qh = kv * group + pair % group, row = (batch * pb.t + i) * pb.hq + qh;
      if (m * pb.c + g.first_key(bh, pb.t, i) > j) continue;  // a reset between j and i
      auto qu = [&](int64_t x) { return load<T>(in.q, off4(in.q, batch, i, qh, x)); };
      auto qs = [&](int64_t x) { return float(pb.scale) * qu(x); };
      const float dot = scaled_dot(kk, pb.d, qu, pb.scale);
      const float decay = expf(g.since_reset(bh, pb.t, i) - rj);
      const float* dn = w.dnum + row * pb.e;
      float mv = 0.f;
      if (form.exact) {
        for (int64_t y = 0; y < pb.e; ++y)
          mv += load<T>(in.dout, off4(in.dout, batch, i, qh, y)) * (vv[y] - load<T>(in.o, off4(in.o, batch, i, qh, y)));
        mv *= w.rden[row];
      } else {
        mv = dot_with(vv, pb.e, [&](int64_t y) { return dn[y]; }) + w.dden[row];
      }
      const float A = ipowf(dot, pb.p) * decay, B = pb.p * ipowf(dot, pb.p - 1) * decay * mv;
      if (A != 0.f)
        for (int64_t y = 0; y < pb.e; ++y) atomicAdd(&accv[y], A * dn[y]);
      if (B != 0.f)
        for (int64_t x = 0; x < pb.d; ++x) atomicAdd(&acck[x], double(B) * qs(x));
    }
  }
  __syncthreads();
  double kdk = 0.0;
  for (int64_t x = threadIdx.x; x < pb.d; x += blockDim.x) {
    store_any(in.dk, off4(in.dk, batch, j, kv, x), float(acck[x]));
    kdk += double(kk[x]) * acck[x];
  }
  for (int64_t y = threadIdx.x; y < pb.e; y += blockDim.x) store_any(in.dv, off4(in.dv, batch, j, kv, y), accv[y]);
  kdk = block_sum(kdk, scratch64);
  if (threadIdx.x == 0) w.kdk[(batch * pb.t + j) * pb.h + kv] = float(kdk);
}

// One block per (batch, kv head, chunk): dlog_g_l = the sum of dG_i over the tokens i >= l of l's chunk
// in l's segment between resets (0 at a reset), plus, where no reset follows l in its chunk, the chunk's
// boundary term (null: 0). Summing each chunk from its exact boundary term, not from the next chunk's
// sums, keeps the cancellation of q . dq against k . dk inside one chunk. Each thread takes a run of
// tokens; what each run receives from its right comes from a scan of the runs, then each thread writes
// its run. With one chunk per head (t = 4096 at P1: 8 blocks) the block is the whole parallelism: 128
// threads of 32-token runs and one thread combining the runs took 80 us on an H100.
constexpr int kGateThreads = 1024;
[[maybe_unused]] static __global__ void __launch_bounds__(kGateThreads)
    gate_gradients_kernel(expanse_tensor log_g, expanse_tensor dlog_g, backward_work w, const double* boundary,
                          expanse_problem pb) {
  __shared__ float run_sum[kGateThreads];
  __shared__ int run_has_reset[kGateThreads];
  const int64_t m = blockIdx.x % pb.n, head = blockIdx.x / pb.n, kv = head % pb.h, batch = head / pb.h;
  const int64_t group = pb.hq / pb.h, chunk_first = m * pb.c, len = min(pb.c, pb.t - chunk_first);
  const int64_t per = (len + blockDim.x - 1) / blockDim.x;
  const int64_t first = chunk_first + min(len, threadIdx.x * per), end = chunk_first + min(len, (threadIdx.x + 1) * per);
  auto dG = [&](int64_t i) {
    float s = -w.kdk[(batch * pb.t + i) * pb.h + kv];
    for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) s += w.qdq[(batch * pb.t + i) * pb.hq + qh];
    return s / float(pb.p);
  };
  auto is_reset = [&](int64_t i) { return isinf(*ptrf(log_g, off3(log_g, batch, i, kv))) && *ptrf(log_g, off3(log_g, batch, i, kv)) < 0; };
  float sum = 0.f;  // of the run's tokens before its first reset
  int has_reset = 0;
  for (int64_t i = first; i < end && !has_reset; ++i) {
    if (is_reset(i)) has_reset = 1;
    else sum += dG(i);
  }
  run_sum[threadIdx.x] = sum;
  run_has_reset[threadIdx.x] = has_reset;
  __syncthreads();
  // Run k carries a value x from its right to its left as x -> sum_k + (has_reset_k ? 0 : x). A
  // Hillis-Steele suffix scan composes these maps over runs k, k + 1, ... (a reset cuts off the
  // right); the value entering run k is then runs k + 1.. applied to the chunk's boundary term.
  for (int stride = 1; stride < kGateThreads; stride *= 2) {
    float s = run_sum[threadIdx.x];
    int r = run_has_reset[threadIdx.x];
    if (threadIdx.x + stride < kGateThreads && !r) s += run_sum[threadIdx.x + stride], r = run_has_reset[threadIdx.x + stride];
    __syncthreads();
    run_sum[threadIdx.x] = s;
    run_has_reset[threadIdx.x] = r;
    __syncthreads();
  }
  const float right_end = boundary ? float(boundary[head * pb.n + m]) : 0.f;
  const int next = int(threadIdx.x) + 1;
  float acc = next < kGateThreads ? run_sum[next] + (run_has_reset[next] ? 0.f : right_end) : right_end;
  for (int64_t i = end - 1; i >= first; --i) {
    if (is_reset(i)) acc = 0.f;
    else acc += dG(i);
    *ptrf(dlog_g, off3(dlog_g, batch, i, kv)) = is_reset(i) ? 0.f : acc;
  }
}

// The gates' gradients inside each chunk, for the core operations (one thread per batch, kv head and
// chunk; 0 at resets). c_i is the per-token term:
//   reverse:   dlog_g_l = sum_{i >= l in m} c_i, c_i = (sum_heads q.dq - [keys] k.dk) / p
//              (query_state: Gc_i holds log_g_l for l <= i; chunk_attention: the pairs j < l <= i)
//   exclusive: dlog_g_l = sum_{j < l in m} c_j, c_j = k.dk / p (update_state: A_m - Gc_j holds l > j)
enum class chunk_gate_sum : int { reverse_queries, reverse_queries_minus_keys, exclusive_keys };
[[maybe_unused]] static __global__ void chunk_gate_gradients_kernel(expanse_tensor log_g, expanse_tensor dlog_g, backward_work w,
                                            expanse_problem pb, chunk_gate_sum mode) {
  const int64_t group = pb.hq / pb.h;
  EXPANSE_GRID_LOOP(idx, pb.b * pb.h * pb.n) {
    const int64_t m = idx % pb.n, kv = (idx / pb.n) % pb.h, batch = idx / (pb.n * pb.h);
    const int64_t first = m * pb.c, last = min(first + pb.c, pb.t) - 1;
    auto term = [&](int64_t i) {
      float s = 0.f;
      if (mode != chunk_gate_sum::exclusive_keys)
        for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) s += w.qdq[(batch * pb.t + i) * pb.hq + qh];
      if (mode != chunk_gate_sum::reverse_queries) {
        const float kdk = w.kdk[(batch * pb.t + i) * pb.h + kv];
        s += mode == chunk_gate_sum::exclusive_keys ? kdk : -kdk;
      }
      return s / float(pb.p);
    };
    auto is_reset = [&](int64_t i) {
      const float x = *ptrf(log_g, off3(log_g, batch, i, kv));
      return isinf(x) && x < 0;
    };
    float sum = 0.f;
    if (mode == chunk_gate_sum::exclusive_keys) {
      for (int64_t l = first; l <= last; ++l) {
        if (is_reset(l)) sum = 0.f;
        *ptrf(dlog_g, off3(dlog_g, batch, l, kv)) = sum;  // 0 at a reset
        sum += term(l);
      }
    } else {
      for (int64_t l = last; l >= first; --l) {
        if (is_reset(l)) {
          sum = 0.f;
          *ptrf(dlog_g, off3(dlog_g, batch, l, kv)) = 0.f;
          continue;
        }
        sum += term(l);
        *ptrf(dlog_g, off3(dlog_g, batch, l, kv)) = sum;
      }
    }
  }
}

// chunk_attention_backward's cotangents with rowmax held: dnum = exp(-rowmax) dy, dden = exp(-rowmax) dl
// (query_state_backward's intra gradients, the other way: dy = exp(rowmax) dnum, dl = exp(rowmax) dden).
// One thread per (batch, token, query head, column), column e for the denominator.
[[maybe_unused]] static __global__ void rowmax_scaling_kernel(expanse_tensor rowmax, expanse_tensor dy, expanse_tensor dl, backward_work w,
                                      expanse_problem pb, int to_intra) {
  EXPANSE_GRID_LOOP(idx, pb.b * pb.t * pb.hq * (pb.e + 1)) {
    const int64_t col = idx % (pb.e + 1), row = idx / (pb.e + 1);
    const int64_t qh = row % pb.hq, i = (row / pb.hq) % pb.t, batch = row / (pb.hq * pb.t);
    const float rm = loadf(rowmax, off3(rowmax, batch, i, qh));
    if (to_intra) {
      if (col < pb.e && dy.data) *ptrf(dy, off4(dy, batch, i, qh, col)) = expf(rm) * w.dnum[row * pb.e + col];
      if (col == pb.e && dl.data) *ptrf(dl, off3(dl, batch, i, qh)) = expf(rm) * w.dden[row];
    } else {
      if (col < pb.e) w.dnum[row * pb.e + col] = expf(-rm) * loadf(dy, off4(dy, batch, i, qh, col));
      if (col == pb.e) w.dden[row] = dl.data ? expf(-rm) * loadf(dl, off3(dl, batch, i, qh)) : 0.f;
    }
  }
}

// discumsum_backward, one lane group per (batch, head) and kLaneGroup consecutive elements, a lane
// per element: Y recomputed into Yw [b,h,n+1,elems], then G_m = dY_m + exp(A_m) G_{m+1} backwards;
// dA_m (f32 [b,n,h], zeroed) gets the group's sum of exp(A_m) G_{m+1} Y_m by one atomic add. Every
// lane of a group takes part (lanes past `elems` add 0): with an add per element, the threads of a
// head all hit the same dA_m at once (272M adds on 8 addresses at a time for P1's states of 1M tokens).
// As in discumsum_kernel, the element's offsets are found once (their divisions cost more than the
// step) and each sweep loads kDiscumsumAhead chunks before it uses them.
template <class T>
__global__ void discumsum_backward_kernel(expanse_tensor X, expanse_tensor A, expanse_tensor init, expanse_tensor dY,
                                          expanse_tensor dX, float* dA, expanse_tensor dinit, float* Yw, int64_t n,
                                          int64_t elems) {
  const int64_t b = X.shape[0], h = X.shape[2];
  const int lane = threadIdx.x % kLaneGroup;
  const int64_t groups_per_head = (elems + kLaneGroup - 1) / kLaneGroup;
  for (int64_t group = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLaneGroup; group < b * h * groups_per_head;
       group += int64_t(gridDim.x) * blockDim.x / kLaneGroup) {
    const int64_t elem = (group % groups_per_head) * kLaneGroup + lane, head = (group / groups_per_head) % h,
                  batch = group / (groups_per_head * h);
    const bool in = elem < elems;
    // Element `elem` of slot 0 of a [b,N,h,...] tensor (slot m: + m strides[1]).
    auto first = [&](const expanse_tensor& t) {
      return in ? batch * t.strides[0] + head * t.strides[2] + trailing_offset(X, t, elem) : 0;
    };
    const T* xs = static_cast<const T*>(X.data) + first(X);
    const float* dys = ptrf(dY, first(dY));
    const int64_t dx0 = first(dX);
    const float* as = ptrf(A, off3(A, batch, 0, head));
    const int64_t xm = X.strides[1], dym = dY.strides[1], dxm = dX.strides[1], am = A.strides[1];
    float* Y = Yw + ((batch * h + head) * (n + 1)) * elems + elem;  // Y[m * elems]
    // init and dinit as [b,1,h,...] views (with_chunk_axis), f32.
    float y = in && init.data ? *ptrf(init, first(init)) : 0.f;
    for (int64_t m0 = 0; in && m0 < n; m0 += kDiscumsumAhead) {
      float x[kDiscumsumAhead], decay[kDiscumsumAhead];
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        const int64_t m = m0 + j < n ? m0 + j : n - 1;  // past the end: a repeated load, unused
        x[j] = to_f32(xs[m * xm]);
        decay[j] = expf(as[m * am]);
      }
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        if (m0 + j >= n) break;
        Y[(m0 + j) * elems] = y;
        y = decay[j] * y + x[j];
      }
    }
    float G = in ? dys[n * dym] : 0.f;
    for (int64_t m1 = n - 1; m1 >= 0; m1 -= kDiscumsumAhead) {  // chunks m1, m1 - 1, ...
      float dy[kDiscumsumAhead], ym[kDiscumsumAhead], decay[kDiscumsumAhead];
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        const int64_t m = m1 - j >= 0 ? m1 - j : 0;
        decay[j] = expf(as[m * am]);  // the same for every lane of the group
        dy[j] = in ? dys[m * dym] : 0.f;
        ym[j] = in ? Y[m * elems] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kDiscumsumAhead; ++j) {
        const int64_t m = m1 - j;
        if (m < 0) break;
        if (in) store_any(dX, dx0 + m * dxm, G);
        float part = decay[j] * G * ym[j];
        for (int mask = kLaneGroup / 2; mask > 0; mask /= 2) part += shfl_xor_group(part, mask);
        if (lane == 0 && decay[j] != 0.f) atomicAdd(&dA[(batch * n + m) * h + head], part);
        G = dy[j] + decay[j] * G;
      }
    }
    if (in && dinit.data) *ptrf(dinit, first(dinit)) = G;
  }
}

// x[0..count) = 0.
[[maybe_unused]] static __global__ void zero_kernel(float* x, int64_t count) {
  EXPANSE_GRID_LOOP(i, count) x[i] = 0.f;
}

// A contiguous [b,n,h] f32 array into a strided [b,n,h] tensor.
[[maybe_unused]] static __global__ void copy_to_tensor3_kernel(const float* src, expanse_tensor dst) {
  const int64_t n = dst.shape[1], h = dst.shape[2];
  EXPANSE_GRID_LOOP(i, dst.shape[0] * n * h) *ptrf(dst, off3(dst, i / (n * h), (i / h) % n, i % h)) = src[i];
}

}  // namespace expanse_gpu
