// The intra-chunk pairs of power_attention_backward, flash style on tensor cores (mma.sync, sm_80+).
// With the query cotangents dnum_i = r_i dout_i (r_i = 1 / den_i, or 1 unnormalized) and dden_i given
// (docs/spec.md "Gradients", chunked form), for the pairs j <= i of one chunk (keys before a query's
// last reset masked):
//   A_ij = s_ij^p exp(Gc_i - Gc_j),  s_ij = scale q_i . k_j,  M_ij = r_i dout_i . v_j + dden_i,
//   B_ij = p s_ij^(p-1) exp(Gc_i - Gc_j) M_ij
//   dv_j = sum_i (r_i A_ij) dout_i,  dk_j = scale sum_i B_ij q_i,  dq_i += sum_j B_ij k_j (unscaled)
// The products take dout itself (the input, exact in b16) and apply r_i in f32: dnum rounded to b16
// would make M_ij = r_i dout_i . (v_j - o_i) lose its digits where v_j is close to o_i (a query that
// sees one key). No stabilizer is needed: r_i A_ij <= 1 (normalized). The gates' gradient needs
// q_i . dq_i and k_j . dk_j of the pairs, p sum_j A_ij M_ij and p sum_i A_ij M_ij: their row and
// column sums are taken from the same f32 values, so that the differences the gates' gradient sums
// stay exact where they telescope.
//
// CTA: 4 warps and one block of 64 keys of one chunk and kv head; each warp owns 16 keys (their dk,
// dv accumulate in registers over every query block of the chunk at or after the key block, for
// every query head of the kv head). Per query block the warp computes S^T = K Q^T and
// dP^T = V dnum^T (16 keys x 64 queries), then dV += A^T dnum and dK += B^T Q; B^T goes through
// shared memory so that each warp can form dQ for 16 queries against all 64 keys, added to the f32
// dq accumulator with atomics (other key blocks add to the same rows). The query blocks (every
// query head's, in turn) are double-buffered: the next block's q and dout rows arrive by cp.async
// and its per-row values by plain loads while this one is multiplied.
#pragma once

#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

struct flash_backward_params {
  const void* q;
  const void* k;
  const void* v;
  int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh;  // last dims contiguous
  const void* dout;   // [b,t,hq,e], the input dtype, last dim contiguous
  int64_t o_sb, o_st, o_sh;
  const float* rden;  // [b,t,hq]: r_i; null: 1 (unnormalized)
  const float* dden;  // [b,t,hq]; null: 0 (unnormalized)
  float* row_am;      // [b,t,hq] f32: sum_j A_ij M_ij, added to
  float* key_am;      // [b,t,h] f32: sum over query heads and i of A_ij M_ij, written
  float* dq;          // [b,t,hq,d] f32, contiguous: added to
  float* dk;          // [b,t,h,d] f32, contiguous: written
  float* dv;          // [b,t,h,e] f32, contiguous: written
  gates g;
  int64_t t, c, n, h, hq;
  int key_tiles;
  // Chunk-heads (a chunk of one kv head and batch) per group of the CTA order, below.
  int64_t group;
  float scale;
};

// The chunk-heads whose q, dout and dq sums stay in L2 together: the CTA order takes the key blocks
// longest first within groups of this many chunk-heads (docs/performance.md).
inline int64_t flash_backward_group(int64_t c, int64_t t, int64_t query_heads_per_kv, int d, int e) {
  const int64_t rows = std::min(c, t) * query_heads_per_kv;
  return chunk_heads_per_l2_group(rows * (2 * d + 2 * e + 4 * d));
}

namespace flash_backward_cfg {
constexpr int kThreads = 128, kKeys = 64, kRows = 64;
}

template <class T, int DH, int E>
constexpr size_t flash_backward_smem() {
  using namespace flash_backward_cfg;
  return (size_t(kKeys) * (DH + 8) + size_t(kKeys) * (E + 8) + 2 * (size_t(kRows) * (DH + 8) + size_t(kRows) * (E + 8)) +
          size_t(kKeys) * (kRows + 8)) * sizeof(T) +
         kKeys * sizeof(float) + 2 * kRows * sizeof(float4);
}

// The pieces below but add_dq_rows are shared with the wgmma kernel
// (kernels/sm90/wgmma_flash_chunk_attention_backward.cuh, whose dq goes by vector reductions), whose m64
// accumulators have this kernel's per-warp layout: warp w holds keys 16 w + g and + 8, and queries
// 8 nt + 2 tq and + 1 of each n-tile nt.

// The key block a CTA takes (`keys` keys of one chunk and kv head), in order of their work, the
// longest first (block 0 of every chunk-head, then block 1, ...; a key block sees every query block
// at or after it), within groups of P.group chunk-heads taken in turn. Over all chunk-heads at once
// (P1 t = 65536: 512) the CTAs in flight touched 200 MB of q, dout and dq sums, and the kernel read
// 4 GB from DRAM.
struct backward_key_block {
  int64_t kv, batch, bh;
  int64_t first, len;  // the chunk's first token and its length
  int k0;              // the block's first key in the chunk (past len: nothing to do)
  int64_t group;       // query heads per kv head
};
__device__ __forceinline__ backward_key_block decode_key_block(const flash_backward_params& P, int keys) {
  const cta_coords at = decode_cta_by_rank(P.key_tiles, P.h, P.n, P.group);  // rank = key tile
  backward_key_block kb;
  kb.kv = at.head, kb.batch = at.batch, kb.bh = at.batch * P.h + at.head;
  kb.first = at.chunk * P.c, kb.len = min(P.c, P.t - kb.first);
  kb.k0 = at.tile * keys;
  kb.group = P.hq / P.h;
  return kb;
}

// The values of query row `row` (its index in the chunk): {restarted Gc (base 2), dden, r, first key
// (its bits)}; a row past the chunk gets r = 0 and sees no key. In two steps, the loads and then the
// arithmetic on them, so that a kernel can issue the loads a block ahead and use them a block later
// (the arithmetic right after the loads made the warp wait for them there).
__device__ __forceinline__ float4 backward_row_loads(const flash_backward_params& P, int64_t batch, int64_t bh, int64_t qh,
                                                     int64_t first, int64_t len, int64_t row) {
  const bool in = row < len;
  const int64_t i = first + row;
  float4 r;
  r.x = in ? P.g.since_reset(bh, P.t, i) : 0.f;
  r.y = in && P.dden ? P.dden[(batch * P.t + i) * P.hq + qh] : 0.f;
  r.z = !in ? 0.f : P.rden ? P.rden[(batch * P.t + i) * P.hq + qh] : 1.f;
  r.w = __int_as_float(!in ? int(len) : P.g.last_reset ? P.g.last_reset[bh * P.t + i] : 0);  // first_key but its max
  return r;
}
__device__ __forceinline__ float4 backward_row_finish(float4 loads) {
  return make_float4(loads.x * kLog2e, loads.y, loads.z, __int_as_float(max(0, __float_as_int(loads.w))));
}
__device__ __forceinline__ float4 backward_row_values(const flash_backward_params& P, int64_t batch, int64_t bh, int64_t qh,
                                                      int64_t first, int64_t len, int64_t row) {
  return backward_row_finish(backward_row_loads(P, batch, bh, qh, first, len, row));
}

// The terms of n-tile nt (queries q0 + 8 nt + 2 tq and + 1) against this thread's two keys, from the
// tile's S^T and dP^T: r_i A_ij (a_val, for dv) and B_ij scale / p (b_val, for dk and dq) in the
// fragment's order; the sums of A_ij M_ij added to key_sum by key and written to am_col by query (over
// the keys). B in those units (the kernels multiply dk by p and dq by p / scale) is what the wgmma
// kernel's factored terms form without a multiplication more.
template <int kP>
__device__ __forceinline__ void backward_pair_terms(float scale, const float4* rows, int q0, int nt, int tq,
                                                    const int (&key_local)[2], const float (&gkey)[2],
                                                    const float (&st)[4], const float (&dpt)[4], float (&a_val)[4],
                                                    float (&b_val)[4], float (&key_sum)[2], float (&am_col)[2]) {
  am_col[0] = am_col[1] = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int hf = i >> 1, row = nt * 8 + 2 * tq + (i & 1), key = key_local[hf];
    const float4 rv = rows[row];  // the same two rows for every hf: loaded once
    const bool valid = q0 + row >= key && key >= __float_as_int(rv.w);
    const float s = scale * st[i];
    const float decay = valid ? fast_exp2(rv.x - gkey[hf]) : 0.f;
    float pw = 1.f;  // s^(p-1)
#pragma unroll
    for (int k = 1; k < kP; ++k) pw *= s;
    const float a = pw * s * decay, mm = fmaf(dpt[i], rv.z, rv.y);
    a_val[i] = a * rv.z;
    b_val[i] = scale * pw * decay * mm;
    key_sum[hf] = fmaf(a, mm, key_sum[hf]);
    am_col[i & 1] = fmaf(a, mm, am_col[i & 1]);
  }
}

// The queries' sums of A M over a warp's 16 keys, four n-tiles (eight rows per tq) at a time: n-tile
// nt's am_col goes to am_rows[2 (nt % 4)]; after the fourth, the eight lanes of a tq (g = 0..7) halve
// the values between them at each of three shuffles, so that lane g ends with row index g of the
// eight, added atomically over the CTA's warps and the other key blocks (48 shuffles and 16 atomics
// per query block before, one sum per row at a time).
__device__ __forceinline__ void add_query_sums(float (&am_rows)[8], const float (&am_col)[2], int nt, int g, int tq, int q0,
                                               int64_t len, float* row_am, int64_t hq) {
  am_rows[(nt & 3) * 2 + 0] = am_col[0];
  am_rows[(nt & 3) * 2 + 1] = am_col[1];
  if ((nt & 3) != 3) return;
  float w[4], x[2];
  const bool b2 = (g >> 2) & 1, b1 = (g >> 1) & 1, b0 = g & 1;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = (b2 ? am_rows[i + 4] : am_rows[i]) + __shfl_xor_sync(0xffffffffu, b2 ? am_rows[i] : am_rows[i + 4], 16);
#pragma unroll
  for (int i = 0; i < 2; ++i) x[i] = (b1 ? w[i + 2] : w[i]) + __shfl_xor_sync(0xffffffffu, b1 ? w[i] : w[i + 2], 8);
  const float sum = (b0 ? x[1] : x[0]) + __shfl_xor_sync(0xffffffffu, b0 ? x[0] : x[1], 4);
  const int row = ((nt & ~3) + (g >> 1)) * 8 + 2 * tq + (g & 1);
  if (q0 + row < len) atomicAdd(row_am + int64_t(row) * hq, sum);
}

// Adds a warp's dQ rows (queries q0 + 16 warp + g and + 8, DH columns), times `unit`, to the f32 dq sums.
template <int DH>
__device__ __forceinline__ void add_dq_rows(const flash_backward_params& P, const float (&dqa)[DH / 8][4], float unit,
                                            int64_t batch, int64_t qh, int64_t first, int64_t len, int q0, int warp, int g,
                                            int tq) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = q0 + warp * 16 + g + 8 * hf;
    if (row >= len) continue;
    float* out = P.dq + ((batch * P.t + first + row) * P.hq + qh) * DH;
#pragma unroll
    for (int nt = 0; nt < DH / 8; ++nt) {
#if __CUDA_ARCH__ >= 900  // one vector atomic for the two neighbours (sm_90's float2 atomicAdd)
      atomicAdd(reinterpret_cast<float2*>(out + nt * 8 + 2 * tq), make_float2(unit * dqa[nt][2 * hf], unit * dqa[nt][2 * hf + 1]));
#else
      atomicAdd(out + nt * 8 + 2 * tq, unit * dqa[nt][2 * hf]);
      atomicAdd(out + nt * 8 + 2 * tq + 1, unit * dqa[nt][2 * hf + 1]);
#endif
    }
  }
}

// Writes this thread's two keys' dk (times dk_unit), dv and sums of A M (summed over the quad first).
template <int DH, int E>
__device__ __forceinline__ void store_key_sums(const flash_backward_params& P, float dk_unit, const float (&dk)[DH / 8][4],
                                               const float (&dv)[E / 8][4], float (&key_sum)[2], const int (&key_local)[2],
                                               int64_t batch, int64_t kv, int64_t first, int64_t len, int tq) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    key_sum[hf] += __shfl_xor_sync(0xffffffffu, key_sum[hf], 1);
    key_sum[hf] += __shfl_xor_sync(0xffffffffu, key_sum[hf], 2);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    if (key_local[hf] >= len) continue;
    const int64_t j = batch * P.t + first + key_local[hf];
    if (P.key_am && tq == 0) P.key_am[j * P.h + kv] = key_sum[hf];
    float* dk_row = P.dk + (j * P.h + kv) * DH;
    float* dv_row = P.dv + (j * P.h + kv) * E;
#pragma unroll
    for (int nt = 0; nt < DH / 8; ++nt)
      *reinterpret_cast<float2*>(dk_row + nt * 8 + 2 * tq) = make_float2(dk_unit * dk[nt][2 * hf], dk_unit * dk[nt][2 * hf + 1]);
#pragma unroll
    for (int nt = 0; nt < E / 8; ++nt)
      *reinterpret_cast<float2*>(dv_row + nt * 8 + 2 * tq) = make_float2(dv[nt][2 * hf], dv[nt][2 * hf + 1]);
  }
}

// Three CTAs per SM (at most 168 registers, a few spilled): with two (255 registers) the kernel was
// latency-bound at 8 warps per SM, 15% issue utilization (ncu, P1 t = 4096); three took P1's backward
// from 1.559 to 1.387 ms at t = 4096 and 16.68 to 16.18 ms at 65536 on an H100, four (128
// registers, 800 bytes spilled) lost it again.
// kP, the degree, is a template argument: with p read at run time the per-pair power s^(p-1) was an
// unrolled loop with a branch per count, 4352 instructions in the query-block loop (1153 FMULs, 365
// branches) against 160 MMAs.
template <class T, int DH, int E, int kP>
__global__ void __launch_bounds__(128, 3) flash_chunk_attention_backward_kernel(flash_backward_params P) {
  using namespace flash_backward_cfg;
  constexpr int kKS = DH + 8, kVS = E + 8, kBS = kRows + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Two buffers of a query block each (q, dout, and the rows' values), addressed by arithmetic.
  T* ks = reinterpret_cast<T*>(smem_raw);  // [kKeys][kKS]
  T* vs = ks + kKeys * kKS;                // [kKeys][kVS]
  T* qs0 = vs + kKeys * kVS;               // [2][kRows][kKS]
  T* ds0 = qs0 + 2 * kRows * kKS;          // [2][kRows][kVS]: dout
  T* bts = ds0 + 2 * kRows * kVS;          // [kKeys][kBS]: B^T of the query block
  // [2][kRows]: each query row's restarted Gc (base 2), dden, r and first key (its bits), one
  // 16-byte load for the four (four loads per row and score before).
  float4* rows0 = reinterpret_cast<float4*>(bts + kKeys * kBS);
  float* gk = reinterpret_cast<float*>(rows0 + 2 * kRows);  // restarted Gc of the keys, base 2

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  constexpr int kQStep = kThreads / (DH / 8), kDStep = kThreads / (E / 8);  // rows per pass of the copies
  static_assert(kThreads % (DH / 8) == 0 && kRows % kQStep == 0 && kThreads % (E / 8) == 0 && kRows % kDStep == 0,
                "the row copies divide evenly");
  const backward_key_block kblk = decode_key_block(P, kKeys);
  const int64_t kv = kblk.kv, batch = kblk.batch, bh = kblk.bh, first = kblk.first, len = kblk.len, group = kblk.group;
  const int k0 = kblk.k0;
  if (k0 >= len) return;

  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + kv * P.k_sh;
  const T* vbase = static_cast<const T*>(P.v) + batch * P.v_sb + kv * P.v_sh;
  for (int vi = tid; vi < kKeys * DH / 8; vi += kThreads) {
    const int s = vi / (DH / 8), c8 = vi % (DH / 8);
    *reinterpret_cast<uint4*>(ks + s * kKS + c8 * 8) =
        k0 + s < len ? *reinterpret_cast<const uint4*>(kbase + (first + k0 + s) * P.k_st + c8 * 8) : make_uint4(0, 0, 0, 0);
  }
  for (int vi = tid; vi < kKeys * E / 8; vi += kThreads) {
    const int s = vi / (E / 8), c8 = vi % (E / 8);
    *reinterpret_cast<uint4*>(vs + s * kVS + c8 * 8) =
        k0 + s < len ? *reinterpret_cast<const uint4*>(vbase + (first + k0 + s) * P.v_st + c8 * 8) : make_uint4(0, 0, 0, 0);
  }
  if (tid < kKeys) gk[tid] = k0 + tid < len ? P.g.since_reset(bh, P.t, first + k0 + tid) * kLog2e : 0.f;
  __syncthreads();

  const int key_local[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  const float gkey[2] = {gk[warp * 16 + g], gk[warp * 16 + g + 8]};

  float dk[DH / 8][4], dv[E / 8][4];
#pragma unroll
  for (int nt = 0; nt < DH / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[nt][i] = 0.f;
#pragma unroll
  for (int nt = 0; nt < E / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) dv[nt][i] = 0.f;
  float key_sum[2] = {0.f, 0.f};  // sum of A_ij M_ij over the queries, for this thread's two keys

  // The query blocks at or after the key block, every query head's in turn: step s is block
  // s % blocks of query head kv group + s / blocks.
  const int blocks = (int(len) - k0 + kRows - 1) / kRows, steps = int(group) * blocks;
  auto issue_rows = [&](int step, int buf) {  // cp.async of the block's q and dout rows
    const int64_t qh = kv * group + step / blocks;
    const int q0 = k0 + (step % blocks) * kRows;
    const T* qbase = static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh;
    const T* dbase = static_cast<const T*>(P.dout) + batch * P.o_sb + qh * P.o_sh;
    T* qs = qs0 + buf * kRows * kKS;
    T* ds = ds0 + buf * kRows * kVS;
    // A thread copies the same 16 bytes of rows r0, r0 + kQStep, ...: one row address computed per
    // block, then stepped (a 64-bit product per copy before, a quarter of the loop's integer work).
    const int qr0 = tid / (DH / 8), qc = (tid % (DH / 8)) * 8, dr0 = tid / (E / 8), dc = (tid % (E / 8)) * 8;
    const T* qsrc = qbase + (first + q0 + qr0) * P.q_st + qc;
    const T* dsrc = dbase + (first + q0 + dr0) * P.o_st + dc;
#pragma unroll
    for (int i = 0; i < kRows / kQStep; ++i) {
      const int s = qr0 + i * kQStep;
      const bool in = q0 + s < len;  // a row past the chunk reads nothing (its address: the head's first row)
      copy_async<16>(qs + s * kKS + qc, in ? qsrc + i * kQStep * P.q_st : qbase, in);
    }
#pragma unroll
    for (int i = 0; i < kRows / kDStep; ++i) {
      const int s = dr0 + i * kDStep;
      const bool in = q0 + s < len;
      copy_async<16>(ds + s * kVS + dc, in ? dsrc + i * kDStep * P.o_st : dbase, in);
    }
    copy_async_commit();
  };
  auto load_row = [&](int step) {  // row tid's loads (tid < kRows)
    return backward_row_loads(P, batch, bh, kv * group + step / blocks, first, len, k0 + (step % blocks) * kRows + tid);
  };
  auto store_row = [&](const float4& loads, int buf) { rows0[buf * kRows + tid] = backward_row_finish(loads); };
  if (steps > 0) {
    issue_rows(0, 0);
    if (tid < kRows) store_row(load_row(0), 0);
  }

  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    const int64_t qh = kv * group + step / blocks;
    const int q0 = k0 + (step % blocks) * kRows;
    const bool more = step + 1 < steps;
    float4 next{};
    if (more) {
      issue_rows(step + 1, buf ^ 1);
      if (tid < kRows) next = load_row(step + 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    // This block's rows have landed, and every warp is done with the previous block (its B^T).
    __syncthreads();
    // The next block's row values into the other buffer, whose last readers passed the previous
    // block's second barrier (stored here, not at once: their loads had the barrier's time to land).
    if (more && tid < kRows) store_row(next, buf ^ 1);
    const T* qs = qs0 + buf * kRows * kKS;
    const T* ds = ds0 + buf * kRows * kVS;
    const float4* rows = rows0 + buf * kRows;
    float* row_am = P.row_am + (batch * P.t + first + q0) * P.hq + qh;
    // The block's 64 queries in two halves of 32 (kHalfTiles n-tiles each): S^T and dP^T for all 64 at
    // once held 64 registers of the 168 and the loop spilled 152 bytes.
    constexpr int kHalfTiles = kRows / 16;
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      const T* q_half = qs + half * (kRows / 2) * kKS;
      const T* dout_half = ds + half * (kRows / 2) * kVS;
      // S^T = K Q^T and V dout^T for this warp's 16 keys and the half's 32 queries. This warp's 16
      // keys and values as A fragments, loaded again for each half: kept in registers across the
      // blocks they took 32 of the 168 and pushed the loop into spilling (368 bytes).
      float st[kHalfTiles][4], dpt[kHalfTiles][4];
      {
        uint32_t ka[DH / 16][4];
#pragma unroll
        for (int kk = 0; kk < DH / 16; ++kk) ldmatrix_x4(ka[kk], ks + (warp * 16 + (lane & 15)) * kKS + kk * 16 + (lane >> 4) * 8);
        rows_times_rows<T, DH, kHalfTiles>(st, ka, q_half, kKS, lane);
      }
      {
        uint32_t va[E / 16][4];
#pragma unroll
        for (int kk = 0; kk < E / 16; ++kk) ldmatrix_x4(va[kk], vs + (warp * 16 + (lane & 15)) * kVS + kk * 16 + (lane >> 4) * 8);
        rows_times_rows<T, E, kHalfTiles>(dpt, va, dout_half, kVS, lane);
      }
      // (r A)^T and B^T, packed as A fragments over the half's queries (k16 slice kk = n-tiles 2kk,
      // 2kk+1), and the sums of A M by query (over this CTA's keys, added to row_am) and by key.
      uint32_t aa[kHalfTiles / 2][4], ba[kHalfTiles / 2][4];
      float am_rows[8];  // this thread's sums of A M over its keys, by row of four n-tiles
#pragma unroll
      for (int ht = 0; ht < kHalfTiles; ++ht) {
        const int nt = half * kHalfTiles + ht;  // the n-tile within the block
        float a_val[4], b_val[4], am_col[2];
        backward_pair_terms<kP>(P.scale, rows, q0, nt, tq, key_local, gkey, st[ht], dpt[ht], a_val, b_val, key_sum, am_col);
        add_query_sums(am_rows, am_col, nt, g, tq, q0, len, row_am, P.hq);
        aa[ht >> 1][(ht & 1) * 2 + 0] = pack2_f32<T>(a_val[0], a_val[1]);
        aa[ht >> 1][(ht & 1) * 2 + 1] = pack2_f32<T>(a_val[2], a_val[3]);
        ba[ht >> 1][(ht & 1) * 2 + 0] = pack2_f32<T>(b_val[0], b_val[1]);
        ba[ht >> 1][(ht & 1) * 2 + 1] = pack2_f32<T>(b_val[2], b_val[3]);
        // B^T rows are this warp's keys, columns the queries.
        *reinterpret_cast<uint32_t*>(bts + (warp * 16 + g) * kBS + nt * 8 + 2 * tq) = ba[ht >> 1][(ht & 1) * 2];
        *reinterpret_cast<uint32_t*>(bts + (warp * 16 + g + 8) * kBS + nt * 8 + 2 * tq) = ba[ht >> 1][(ht & 1) * 2 + 1];
      }
      add_times_tile<T, E, kHalfTiles / 2>(dv, aa, dout_half, kVS, lane);
      add_times_tile<T, DH, kHalfTiles / 2>(dk, ba, q_half, kKS, lane);
    }
    __syncthreads();  // B^T complete

    // dQ for this warp's 16 queries: B (16 queries x 64 keys, read transposed from B^T) times K.
    uint32_t bq[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int mat = lane >> 3;
      ldmatrix_x4_trans(bq[kk], bts + (kk * 16 + (lane & 7) + (mat >> 1) * 8) * kBS + warp * 16 + (mat & 1) * 8);
    }
    float dqa[DH / 8][4];
#pragma unroll
    for (int nt = 0; nt < DH / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dqa[nt][i] = 0.f;
    add_times_tile<T, DH>(dqa, bq, ks, kKS, lane);
    add_dq_rows<DH>(P, dqa, float(kP) / P.scale, batch, qh, first, len, q0, warp, g, tq);
  }

  store_key_sums<DH, E>(P, float(kP), dk, dv, key_sum, key_local, batch, kv, first, len, tq);
}

}  // namespace expanse_cuda
