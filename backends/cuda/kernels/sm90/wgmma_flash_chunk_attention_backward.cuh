// The intra-chunk pairs of power_attention_backward (kernels/sm80/flash_chunk_attention_backward.cuh,
// which states the terms) with its five products on wgmma (sm_90a), for d = e = 64. A CTA takes 128
// keys of a chunk, 64 per consumer warpgroup; per query block of 64 rows, every operand in shared
// memory:
//   S^T = K Q^T, dP^T = V dout^T   A (the warpgroup's keys, values), B (queries, dout) K-major
//   dV += (r A)^T dout             A: the terms stored as rows of keys (K-major), B: dout N-major
//   dK += B^T Q                    likewise, B: the queries N-major
//   dQ = B K                       per warpgroup 32 of its columns over all 128 keys: A the B^T of
//                                  both read M-major, B the keys' columns N-major
// and dQ added to the f32 dq sums by 16-byte vector reductions (red.global.add.v4.f32). The
// terms between the products are the mma.sync kernel's own (backward_pair_terms and that file's
// other shared pieces): wgmma's m64 accumulators have mma.sync's layout per warp. Query blocks past
// the CTA's keys with no reset among them take the factored terms below instead (about half the
// instructions per pair; H200, P1: the kernel 316-326 -> 291-296 us at t = 4096, 1.45 -> 1.37-1.39
// ms at 65536).
//
// Why: the mma.sync kernel is latency-bound at 168 registers (three CTAs per SM), each of its warps
// reading every query and dout block through ldmatrix for its 16 keys. Here the tensor cores read
// each operand once per block, and the terms go to shared memory as soon as they are formed (as
// register fragments for dV and dK they held 32 more registers through the products). With one
// warpgroup of 64 keys per CTA (two CTAs per SM), H100, P1 (ncu): 467 -> 330 us at t = 4096, 1.49 ->
// 1.39 ms at 65536, where without the dq sums it took 222 us and 0.999 ms: the L2's reductions bound
// it, by bulk reductions as by float2 atomics. Two warpgroups sharing the query blocks reduce each
// dq row once per 128 keys: 301-305 us at 4096, but 1.38 ms at 65536, where one CTA per SM (255
// registers) hides less than two did (docs/performance.md lesson 14). The bulk reductions, a row
// per lane, compiled to a loop electing one lane at a time (11% of the stall samples); 16-byte
// vector reductions instead: H200, 293-299 -> 280-282 us at 4096, 1.38 -> 1.34-1.35 ms at 65536.
// The next block's row values are loaded a block ahead and their arithmetic done only when they are
// stored (backward_row_loads, backward_row_finish): done at once, it waited for the loads there,
// with every warp of the CTA behind it at the next barrier: 272 -> 251 us, 1.31 -> 1.18 ms.
// (Warpgroups out of step, the first handing its dQ to the second through shared memory and the
// query blocks in a ring of three with mbarriers, measured 267 us and 1.29 ms: not kept.)
//
// Blocks are rows of 128 bytes with the hardware's 128-byte swizzle, so that one layout serves as
// K-major and as N-major (or M-major) operand; an operand's descriptor may start 32 or 64 bytes into
// the rows (a k16 slice of a K-major one, dQ's 32 columns of the keys). The query and dout blocks
// (every query head's in turn) arrive by cp.async into two buffers, block s + 1 while s is multiplied.
#pragma once

#include "kernels/sm80/flash_chunk_attention_backward.cuh"
#include "kernels/sm90/bulk_copy.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

namespace wgmma_flash_backward_cfg {
constexpr int kDim = 64;                                         // d = e
constexpr int kRowBytes = kDim * 2;                              // one swizzled row: 128 bytes
constexpr int kBlockBytes = flash_backward_cfg::kRows * kRowBytes;  // 8 KB per block of 64 rows
// Two consumer warpgroups, 64 keys each: the CTA's 128 keys share each query and dout block, and its
// dQ (split by columns between the warpgroups) sums over all 128, so that the L2 reduces each dq
// row once per 128 keys. (kWarpgroups = 1 compiles to 64 keys per CTA, dQ's 64 columns, two CTAs per
// SM: not yet measured against this.)
constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups, kKeys = 64 * kWarpgroups;
constexpr int kKeyBlockBytes = kKeys * kRowBytes;
constexpr int kDqColumns = kDim / kWarpgroups;  // a warpgroup's columns of dQ (over all kKeys keys)
// Shared memory: keys, values, (r A)^T and B^T (kKeys rows each); two query and two dout blocks.
constexpr int kKeyBlocks = 4, kRowBlocks = 4;
}  // namespace wgmma_flash_backward_cfg

constexpr size_t wgmma_flash_backward_smem() {
  using namespace wgmma_flash_backward_cfg;
  return 1024 /* alignment */ + size_t(kKeyBlocks) * kKeyBlockBytes + size_t(kRowBlocks) * kBlockBytes +
         2 * flash_backward_cfg::kRows * (sizeof(float4) + sizeof(float2)) +
         2 * kKeys * sizeof(float) + 4 * sizeof(int);
}

// The terms of a block whose queries all come after the CTA's keys with no reset between them, and
// whose Gc are at most m, the Gc of the CTA's last key, itself at most every key's (checked: the
// gates may grow, log_g > 0): every pair is valid, and the decay factors into the query's
// e_i = exp2(Gc_i - m) and the key's e_j = exp2(m - Gc_j), both at most 1 (a factor below f32's range
// leaves a product below it too). With the rows' factors
// rows_f[i] = {scale^p e_i r_i, scale^p e_i dden_i} a pair takes seven instructions where
// backward_pair_terms takes about fifteen (the mask, the exponential, s from st): with
// u = e_j st^(p-1) and w = u st,
//   r A = w rows_f.x,  scale^p e_i M = mm = dP^T rows_f.x + rows_f.y,  B scale / p = u mm,  A M = w mm.
// a_val, b_val and the sums are in backward_pair_terms' units.
template <int kP>
__device__ __forceinline__ float2 factored_row_values(float4 row_values, float m, float scale) {
  // min: the rows the factored terms do not take (past the chunk, or above m: the votes send their
  // blocks to the general terms) keep finite factors.
  const float e = fast_exp2(fminf(row_values.x - m, 0.f));
  float unit = e;  // scale^p e_i
#pragma unroll
  for (int k = 0; k < kP; ++k) unit *= scale;
  return make_float2(unit * row_values.z, unit * row_values.y);
}

template <int kP>
__device__ __forceinline__ void factored_pair_terms(const float2* rows_f, int nt, int tq, const float (&e_key)[2],
                                                    const float (&st)[4], const float (&dpt)[4], float (&a_val)[4],
                                                    float (&b_val)[4], float (&key_sum)[2], float (&am_col)[2]) {
  am_col[0] = am_col[1] = 0.f;
  const float4 rf = *reinterpret_cast<const float4*>(rows_f + nt * 8 + 2 * tq);  // rows 2 tq and + 1
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int hf = i >> 1;
    const float unit_r = i & 1 ? rf.z : rf.x, unit_d = i & 1 ? rf.w : rf.y;
    float u = e_key[hf];
#pragma unroll
    for (int k = 1; k < kP; ++k) u *= st[i];
    const float w = u * st[i], mm = fmaf(dpt[i], unit_r, unit_d);
    a_val[i] = w * unit_r;
    b_val[i] = u * mm;
    key_sum[hf] = fmaf(w, mm, key_sum[hf]);
    am_col[i & 1] = fmaf(w, mm, am_col[i & 1]);
  }
}

template <class T, int kP>
__global__ void __launch_bounds__(wgmma_flash_backward_cfg::kThreads, 2 / wgmma_flash_backward_cfg::kWarpgroups)
    wgmma_flash_chunk_attention_backward_kernel(flash_backward_params P) {
  using namespace wgmma_flash_backward_cfg;
  constexpr int DH = kDim, E = kDim, kRows = flash_backward_cfg::kRows;
  static_assert(kRows == 64, "m64 tiles of queries");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* const kb = static_cast<unsigned char*>(
      __builtin_assume_aligned(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024), 1024));
  unsigned char* const vb = kb + kKeyBlockBytes;
  unsigned char* const at_ = vb + kKeyBlockBytes;  // (r A)^T: rows are keys, 64 queries each
  unsigned char* const bt = at_ + kKeyBlockBytes;  // B^T likewise
  unsigned char* const qb = bt + kKeyBlockBytes;   // [2] query blocks
  unsigned char* const db = qb + 2 * kBlockBytes;  // [2] dout blocks
  float4* const rows0 = reinterpret_cast<float4*>(db + 2 * kBlockBytes);  // [2][kRows] (backward_row_finish)
  float2* const rows_f0 = reinterpret_cast<float2*>(rows0 + 2 * kRows);  // [2][kRows] (factored_row_values)
  float* const gk = reinterpret_cast<float*>(rows_f0 + 2 * kRows);    // the keys' restarted Gc, base 2
  float* const ek = gk + kKeys;                                       // e_j of factored_pair_terms
  int* const rows_below = reinterpret_cast<int*>(ek + kKeys);         // [2][2]: a row warp's Gc all <= m

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int wg = warp / 4, wq = warp % 4;  // this warp's warpgroup (its 64 keys), and warp in it
  const backward_key_block kblk = decode_key_block(P, kKeys);
  const int64_t kv = kblk.kv, batch = kblk.batch, bh = kblk.bh, first = kblk.first, len = kblk.len, group = kblk.group;
  const int k0 = kblk.k0;
  if (k0 >= len) return;

  // Copies of a block's rows (block_rows: kKeys or kRows) into its swizzled place: this thread takes
  // 16-byte chunk tid % 8 of rows tid / 8 + kCopyRows i (zeros past the chunk, whose sources are not
  // read).
  constexpr int kCopyRows = kThreads / 8;
  const int copy_row = tid / 8;
  const uint32_t copy_dst = swizzled_row_offset(copy_row, tid % 8, kRowBytes);
  auto copy_block = [&](auto block_rows, unsigned char* dst, const T* base, int64_t row_stride, int row0) {
    constexpr int kCopies = decltype(block_rows)::value * 8 / kThreads;
    const T* src = base + (first + row0 + copy_row) * row_stride + (tid % 8) * 8;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool in = row0 + copy_row + i * kCopyRows < len;
      copy_async<16>(dst + copy_dst + i * kCopyRows * kRowBytes, in ? src : base, in);
      src += kCopyRows * row_stride;
    }
  };
  const T* const kbase = static_cast<const T*>(P.k) + batch * P.k_sb + kv * P.k_sh;
  const T* const vbase = static_cast<const T*>(P.v) + batch * P.v_sb + kv * P.v_sh;
  using key_rows = std::integral_constant<int, kKeys>;
  using query_rows = std::integral_constant<int, kRows>;
  copy_block(key_rows{}, kb, kbase, P.k_st, k0);
  copy_block(key_rows{}, vb, vbase, P.v_st, k0);
  // m of factored_pair_terms: the Gc of the CTA's last key (only blocks past it take those terms).
  const float g_last = k0 + kKeys - 1 < len ? P.g.since_reset(bh, P.t, first + k0 + kKeys - 1) * kLog2e : 0.f;
  float gk_own = g_last;
  if (tid < kKeys) {
    gk_own = k0 + tid < len ? P.g.since_reset(bh, P.t, first + k0 + tid) * kLog2e : 0.f;
    gk[tid] = gk_own;
    ek[tid] = fast_exp2(fminf(g_last - gk_own, 0.f));
  }
  // Whether every key's Gc is at least m (gates that do not grow over the keys): the factored terms'
  // condition on the keys' side.
  const bool keys_above = __syncthreads_and(gk_own >= g_last);

  // The query blocks at or after the key block, every query head's in turn: step s is block
  // s % blocks of query head kv group + s / blocks.
  const int blocks = (int(len) - k0 + kRows - 1) / kRows, steps = int(group) * blocks;
  auto query_head = [&](int step) { return kv * group + step / blocks; };
  auto query_row0 = [&](int step) { return k0 + (step % blocks) * kRows; };
  auto issue_rows = [&](int step, int buf) {
    const int64_t qh = query_head(step);
    copy_block(query_rows{}, qb + buf * kBlockBytes, static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh, P.q_st,
               query_row0(step));
    copy_block(query_rows{}, db + buf * kBlockBytes, static_cast<const T*>(P.dout) + batch * P.o_sb + qh * P.o_sh, P.o_st,
               query_row0(step));
  };
  issue_rows(0, 0);  // with the keys and values: one group
  copy_async_commit();
  // A block's row values, and whether the Gc of each of its warps' rows are at most m (warps 0 and 1,
  // whole, store them; m is g_last, in the loop read from gk rather than held in a register).
  auto store_rows = [&](const float4& rv, int buf, float m) {
    rows0[buf * kRows + tid] = rv;
    rows_f0[buf * kRows + tid] = factored_row_values<kP>(rv, m, P.scale);
    const bool below = __all_sync(0xffffffffu, rv.x <= m);
    if (lane == 0) rows_below[buf * 2 + warp] = below;
  };
  if (tid < kRows)
    store_rows(backward_row_values(P, batch, bh, query_head(0), first, len, query_row0(0) + tid), 0, g_last);

  // Descriptors: every block's is the key block's plus its distance from it (in the address field's
  // 16-byte units; two base registers rather than one pair per operand). K-major operands step 32
  // bytes per k16 slice within their rows, N-major (and M-major) ones 16 rows per slice.
  const uint64_t kmajor0 = kmajor_swizzled_desc(kb), nmajor0 = nmajor_swizzled_desc(kb, kRowBytes, kBlockBytes, 8 * kRowBytes);
  auto block_desc = [&](uint64_t base, const unsigned char* block) { return base + uint32_t(block - kb) / 16; };
  constexpr uint32_t kBufDesc = kBlockBytes / 16, kKSlice = 32 / 16, kRowSlice = 16 * kRowBytes / 16;
  // This warpgroup's 64 rows of the key-sized blocks (as A), and its columns of the keys (as dQ's B).
  const uint32_t wg_rows = wg * 64 * kRowBytes / 16, wg_columns = wg * kDqColumns * 2 / 16;

  const int key = wg * 64 + wq * 16 + g;  // this thread's first key in the CTA's block
  const int key_local[2] = {k0 + key, k0 + key + 8};
  float dk[DH / 8][4], dv[E / 8][4];
  wgmma_zero(reinterpret_cast<float(&)[1][32]>(dk));
  wgmma_zero(reinterpret_cast<float(&)[1][32]>(dv));
  float key_sum[2] = {0.f, 0.f};  // sum of A_ij M_ij over the queries, for this thread's two keys

  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    const int64_t qh = query_head(step);
    const int q0 = query_row0(step);
    // This block's rows have landed (for the tensor cores too), and every warp is done with the
    // previous block: its buffers and B^T may be written again.
    copy_async_wait<0>();
    fence_async_shared();
    __syncthreads();
    const bool more = step + 1 < steps;
    float4 next{};
    if (more) {
      issue_rows(step + 1, buf ^ 1);
      copy_async_commit();
      if (tid < kRows) next = backward_row_loads(P, batch, bh, query_head(step + 1), first, len, query_row0(step + 1) + tid);
    }

    // S^T and dP^T for the warpgroup's 64 keys and the block's 64 queries.
    float st[8][4], dpt[8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk)
      wgmma_ss<T, 64>(&st[0][0], kmajor0 + wg_rows + kk * kKSlice, block_desc(kmajor0, qb) + buf * kBufDesc + kk * kKSlice,
                      kk > 0);
#pragma unroll
    for (int kk = 0; kk < E / 16; ++kk)
      wgmma_ss<T, 64>(&dpt[0][0], block_desc(kmajor0, vb) + wg_rows + kk * kKSlice,
                      block_desc(kmajor0, db) + buf * kBufDesc + kk * kKSlice, kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(reinterpret_cast<float(&)[32]>(st));
    wgmma_pin(reinterpret_cast<float(&)[32]>(dpt));

    // (r A)^T and B^T into shared memory (rows of keys, the block's queries along them), and the
    // sums of A M by query and by key.
    const float4* rows = rows0 + buf * kRows;
    float* row_am = P.row_am + (batch * P.t + first + q0) * P.hq + qh;
    float am_rows[8];
    auto store_terms = [&](int nt, const float (&a_val)[4], const float (&b_val)[4]) {
      const uint32_t lo = swizzled_row_offset(key, nt, kRowBytes) + 4 * tq, hi = swizzled_row_offset(key + 8, nt, kRowBytes) + 4 * tq;
      *reinterpret_cast<uint32_t*>(at_ + lo) = pack2_f32<T>(a_val[0], a_val[1]);
      *reinterpret_cast<uint32_t*>(at_ + hi) = pack2_f32<T>(a_val[2], a_val[3]);
      *reinterpret_cast<uint32_t*>(bt + lo) = pack2_f32<T>(b_val[0], b_val[1]);
      *reinterpret_cast<uint32_t*>(bt + hi) = pack2_f32<T>(b_val[2], b_val[3]);
    };
    // Past the CTA's keys with no reset since its first (the rows' first keys do not decrease), and
    // Gc not above m on either side: the factored terms. CTA-uniform.
    if (q0 >= k0 + kKeys && __float_as_int(rows[kRows - 1].w) <= k0 && keys_above && rows_below[buf * 2] &&
        rows_below[buf * 2 + 1]) {
      const float2* rows_f = rows_f0 + buf * kRows;
      const float e_key[2] = {ek[key], ek[key + 8]};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        float a_val[4], b_val[4], am_col[2];
        factored_pair_terms<kP>(rows_f, nt, tq, e_key, st[nt], dpt[nt], a_val, b_val, key_sum, am_col);
        add_query_sums(am_rows, am_col, nt, g, tq, q0, len, row_am, P.hq);
        store_terms(nt, a_val, b_val);
      }
    } else {
      const float gkey[2] = {gk[key], gk[key + 8]};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        float a_val[4], b_val[4], am_col[2];
        backward_pair_terms<kP>(P.scale, rows, q0, nt, tq, key_local, gkey, st[nt], dpt[nt], a_val, b_val, key_sum, am_col);
        add_query_sums(am_rows, am_col, nt, g, tq, q0, len, row_am, P.hq);
        store_terms(nt, a_val, b_val);
      }
    }
    fence_async_shared();  // for the tensor cores, after the barrier
    __syncthreads();       // (r A)^T and B^T complete

    // dV and dK of the warpgroup's keys; its kDqColumns columns of dQ over all kKeys keys (the B^T
    // rows of every warpgroup, M-major, against the keys' columns N-major).
    float dqa[kDqColumns / 8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_ss<T, 64, false, true>(&dv[0][0], block_desc(kmajor0, at_) + wg_rows + kk * kKSlice,
                                   block_desc(nmajor0, db) + buf * kBufDesc + kk * kRowSlice);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_ss<T, 64, false, true>(&dk[0][0], block_desc(kmajor0, bt) + wg_rows + kk * kKSlice,
                                   block_desc(nmajor0, qb) + buf * kBufDesc + kk * kRowSlice);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_ss<T, kDqColumns, true, true>(&dqa[0][0], block_desc(nmajor0, bt) + kk * kRowSlice, nmajor0 + wg_columns + kk * kRowSlice,
                                  kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(reinterpret_cast<float(&)[kDqColumns / 2]>(dqa));
    wgmma_pin(reinterpret_cast<float(&)[32]>(dk));
    wgmma_pin(reinterpret_cast<float(&)[32]>(dv));
    // The next block's row values into the other buffer, whose readers passed this block's first
    // barrier (stored here, not at once: their loads had the products' time to land).
    if (more && tid < kRows) store_rows(backward_row_finish(next), buf ^ 1, gk[kKeys - 1]);
    // dQ to the f32 sums: this warp's 16 rows and its warpgroup's columns, 16-byte vector
    // reductions (red.global.add.v4.f32) of four neighbouring columns each, which a thread and its
    // neighbour tq ^ 1 form by trading a pair: the even one adds row g, the odd one row g + 8.
    const float dq_unit = float(kP) / P.scale;  // the terms' units (backward_pair_terms)
    const bool odd = tq & 1;
    const int dq_row = q0 + wq * 16 + g + (odd ? 8 : 0);
    float* const dq_out = P.dq + ((batch * P.t + first + dq_row) * P.hq + qh) * DH + wg * kDqColumns + 2 * (tq & 2);
#pragma unroll
    for (int nt = 0; nt < kDqColumns / 8; ++nt) {
      const float give0 = odd ? dqa[nt][0] : dqa[nt][2], give1 = odd ? dqa[nt][1] : dqa[nt][3];
      const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
      const float4 sum = odd ? make_float4(got0, got1, dqa[nt][2], dqa[nt][3]) : make_float4(dqa[nt][0], dqa[nt][1], got0, got1);
      if (dq_row < len)
        red_add_v4(dq_out + nt * 8, make_float4(dq_unit * sum.x, dq_unit * sum.y, dq_unit * sum.z, dq_unit * sum.w));
    }
  }

  store_key_sums<DH, E>(P, float(kP), dk, dv, key_sum, key_local, batch, kv, first, len, tq);
}

}  // namespace expanse_cuda
