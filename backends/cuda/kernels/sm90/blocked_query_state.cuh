// query_state as expand-MMA on Hopper (wgmma, sm_90a) for expansions in phi blocks (kernels/common.cuh):
// the GEMM of wgmma_query_state.cuh (M = tokens, N = e + 8 with the z column, K = rows of phi,
// B = the state rows in b16 times their coefficients), with one phi block of 64 rows per K step, so
// that phi(Q) comes from two shared-memory reads per token and step. Block row 8 G + l is
//   x[fixed0] x[fixed1] x[mid + G] x[last + l];
// the K columns of A register (ks, h) of a lane are rows G = 2 ks + h, l = 2 tq, 2 tq + 1. Per token
// and step a lane reads x[mid .. mid + 7] (16 bytes, broadcast over the quad) and the pair
// x[last + 2 tq], x[last + 2 tq + 1]; each A register is then one packed multiply. Padding rows of
// a block (row -1) have zero B rows.
//
// Accuracy: the state rows are f32; rounding them to b16 alone costs up to 5e-3 relative error in
// bf16 on strongly gated inputs (the terms of phi(q) . S cancel), the whole SPEC budget, and
// rounding phi(q) costs as much again. So both are split into hi + lo b16 parts and each step
// multiplies A_hi B_hi + A_hi B_lo + A_lo B_hi (three times the tensor work, the same accumulators;
// A_lo B_lo is below the rounding of the result). At p = 2 A_hi + A_lo is the exact product
// x[mid + G] x[last + l]; at p = 3, 4 it is the product of the factors in f32, split.
//
// At p = 2 one f16 product per step keeps the same accuracy: f16_query_state.cuh.
//
// CTA: 2 warpgroups x MT m64 tiles = 128 MT tokens of one chunk x all e, one query head; K steps of
// one block. The state rows of a block (and its z entries) arrive by cp.async R steps ahead
// (state_block_stages.cuh); one pass per step splits a raw stage into the hi and lo B tiles of a
// ring of B buffers. (Loads into register stages had stalled the step on their results: at 255 registers the
// compiler kept them close to their use.) Keep ptxas's C7515 line away from this kernel: it means
// that every wgmma was serialized (docs/performance.md).
#pragma once

#include "kernels/sm90/state_block_stages.cuh"
#include "kernels/sm90/wgmma_query_state.cuh"

namespace expanse_cuda {

namespace blocked_query_state_cfg {
// Raw stages: at step s the rows of block s + 1 are split, those of s + 2 .. s + R - 1 are landing and
// those of s + R are issued (R = 3 where four stages would not fit, at e = 128).
template <int E>
constexpr int raw_stages() { return E <= 64 ? 4 : 3; }
// B tiles (hi + lo) per buffer ring: with three, a step splits the next block into the buffer of
// the step before last, whose products are complete, without waiting for the other warpgroup.
template <int E>
constexpr int b_buffers() { return E <= 64 ? 3 : 2; }
// m64 tiles per warpgroup: 256 tokens per CTA where the accumulators' registers and the query tile's
// shared memory allow it.
template <int E>
constexpr int token_tiles(int d) { return E <= 64 && d <= 128 ? 2 : 1; }
}  // namespace blocked_query_state_cfg

template <class T, int E, int MT>
constexpr size_t blocked_query_state_smem(int d) {
  using namespace wgmma_query_state_cfg;
  using namespace blocked_query_state_cfg;
  return 2 * b_buffers<E>() * size_t(b_tile_elems<E + 8>()) * sizeof(T) + size_t(128 * MT) * (d + 8) * sizeof(T) +
         state_block_cfg::bytes<raw_stages<E>()>(E);
}

// x[mid + G] in both halves of a b16 pair, from the 8 entries x[mid .. mid + 7] of a phi block.
__device__ __forceinline__ uint32_t block_mid_pair(const uint4& mids, int G) { return b16_twice(word_of(mids, G / 2), G & 1); }

// The state stages of the query tile's chunk and head, at raw0 in shared memory.
template <class Stages>
__device__ __forceinline__ Stages query_state_stages(const mma_query_state_params& P, const query_tile& at,
                                                     unsigned char* raw0) {
  return Stages{raw0, P.blocks.row, P.S + at.batch * P.S_sb + at.chunk * P.S_sn + at.kv * P.S_sh,
                P.z ? P.z + at.batch * P.z_sb + at.chunk * P.z_sn + at.kv * P.z_sh : nullptr, P.S_sD, P.z_sD,
                P.blocks.count};
}

// The blocked kernels' epilogue, for warpgroup wg's MT m64 tiles of sums acc: decay, scale^p, the
// intra-chunk term, normalization (den: column E, held by tq = 0). Each sum of token row `local`
// (of the CTA) and column col (E: the denominator) is first multiplied by unscale(local, col).
template <class T, int E, int MT, class Unscale>
__device__ __forceinline__ void store_blocked_outputs(const mma_query_state_params& P, const query_tile& at,
                                                      float (&acc)[MT][E / 2 + 4], int wg, Unscale unscale) {
  constexpr int kNT = E / 8;
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3, g = lane >> 2, tq = lane & 3;
  T* obase = static_cast<T*>(P.o) + at.batch * P.o_sb + at.qh * P.o_sh;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int local = (mt * 2 + wg) * 64 + wq * 16 + hf * 8 + g;
      const float den = __shfl_sync(0xffffffffu, acc[mt][4 * kNT + 2 * hf], lane & ~3) * unscale(local, E);
      if (local >= at.ntok) continue;
      store_query_output<T, kNT>(P, obase, at.batch, at.qh, at.bh, at.tok0 + local, tq, den, [&](int nt, int u) {
        return acc[mt][4 * nt + 2 * hf + u] * unscale(local, nt * 8 + 2 * tq + u);
      });
    }
}

// PM: 2 for p = 2 (fixed factors ignored), 4 for p = 3, 4 (fixed index d reads a column of ones).
template <class T, int E, int PM, int MT>
__global__ void __launch_bounds__(256, 1) blocked_query_state_kernel(mma_query_state_params P) {
  using namespace wgmma_query_state_cfg;
  static_assert(kRowsK == state_block_cfg::kRowsK, "one phi block per K step");
  constexpr int kTok = 128 * MT;
  constexpr int N = E + 8;
  constexpr int kNT = E / 8;  // 8-column blocks of the state; block kNT is the z tile
  constexpr int kChunk = chunk_elems<N>();
  constexpr int b_size = b_tile_elems<N>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = P.d, qs_stride = d + 8;
  constexpr int kBuffers = blocked_query_state_cfg::b_buffers<E>();
  constexpr int kRawStages = blocked_query_state_cfg::raw_stages<E>();
  // The buffers of hi and lo B tiles, then the query tile, then the state stages.
  T* const bt0 = reinterpret_cast<T*>(smem_raw);
  T* const qs = bt0 + 2 * kBuffers * b_size;

  const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, tq = tid & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const query_tile at = decode_query_tile(P, kTok);
  if (at.ntok <= 0) return;
  const int64_t qh = at.qh, batch = at.batch, tok0 = at.tok0, ntok = at.ntok;

  init_query_tiles<T, kTok, kNT, kChunk>(P, qs, qs_stride, batch, qh, tok0, ntok, bt0, 2 * kBuffers, b_size);

  using stages_t = state_block_stages<E, kThreads, kRawStages>;
  const stages_t st = query_state_stages<stages_t>(P, at, reinterpret_cast<unsigned char*>(qs + kTok * qs_stride));
  const int64_t steps = P.blocks.count;
  // Raw stage of block blk -> hi and lo B tiles of buffer buf (the lo tile follows hi).
  auto store_step = [&](int64_t blk, int buf) {
    st.template convert<kChunk / 2>(blk, reinterpret_cast<uint32_t*>(bt0 + 2 * buf * b_size), tid,
                                    [](uint32_t* out, float x0, float x1, int, int) { split2_f32<T>(x0, x1, out[0], out[b_size / 2]); });
  };

  float acc[MT][N / 2];
  wgmma_zero(acc);

  // This lane's tokens: rows g and g + 8 (hf) of its warp's 16 in each of its warpgroup's m64 tiles.
  const T* qrow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) qrow[mt][hf] = qs + ((mt * 2 + wg) * 64 + wq * 16 + hf * 8 + g) * qs_stride;

  // Prologue: the table entries of blocks 0 .. kTableAhead - 1, then the rows of blocks 0 .. R - 1
  // (one group each); block 0 split into buffer 0, block 1 landed.
  for (int64_t b = 0; b < stages_t::kTableAhead; ++b) st.issue_table(b, tid);
  copy_async_commit();
  copy_async_wait<0>();
  __syncthreads();
  for (int64_t b = 0; b < kRawStages; ++b) {
    st.issue_rows(b, tid);
    copy_async_commit();
  }
  copy_async_wait<kRawStages - 1>();
  __syncthreads();
  store_step(0, 0);
  copy_async_wait<kRawStages - 2>();
  fence_async_shared();
  __syncthreads();
  phi_block cur = P.blocks.block[0];  // the block of the step being multiplied
  // The A fragments of a step's K slice ks are read by its products (one wgmma group per ks) until
  // they complete; the next step rewrites them after waiting for that group only, so that the
  // tensor cores still have the rest of this step's products queued while it forms them.
  uint32_t a[kRowsK / 16][MT][4], a_lo[kRowsK / 16][MT][4];
  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step % kBuffers);
    // One group per step: the table entries of step + 2 R - 1 and the rows of step + R (whose table
    // entries have landed).
    st.issue_table(step + stages_t::kTableAhead, tid);
    st.issue_rows(step + kRawStages, tid);
    copy_async_commit();
    const phi_block next = step + 1 < steps ? P.blocks.block[step + 1] : cur;
    const T* bt = bt0 + 2 * buf * b_size;
    // Per token: x[mid .. mid + 7] and the pair at last + 2 tq times the fixed factors.
    uint4 mids[MT][2];
    uint32_t lastf[MT][2];
    float2 last32[MT][2];  // PM = 4: the pair times the fixed factors in f32 (exact: 24 bits)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const T* row = qrow[mt][hf];
        mids[mt][hf] = *reinterpret_cast<const uint4*>(row + cur.mid);
        lastf[mt][hf] = *reinterpret_cast<const uint32_t*>(row + cur.last + 2 * tq);
        if constexpr (PM == 4) {
          const float f = to_f32(row[cur.fixed[0]]) * to_f32(row[cur.fixed[1]]);
          const T* pair = reinterpret_cast<const T*>(&lastf[mt][hf]);
          last32[mt][hf] = make_float2(to_f32(pair[0]) * f, to_f32(pair[1]) * f);
        }
      }
#pragma unroll
    for (int ks = 0; ks < kRowsK / 16; ++ks) {
      wgmma_wait<kRowsK / 16 - 1>();  // the previous step's group ks is complete
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int hf = q & 1, G = 2 * ks + (q >> 1);
          const uint32_t both = block_mid_pair(mids[mt][hf], G);  // x[mid + G] twice
          if constexpr (PM == 4) {
            // Four factors: the product in f32 (one rounding, 2^-24), then split (b16 products of b16
            // pairs would round twice more, 2^-9 each, the whole bf16 budget on strongly gated inputs).
            const float xm = to_f32(reinterpret_cast<const T*>(&both)[0]);
            split2_f32<T>(xm * last32[mt][hf].x, xm * last32[mt][hf].y, a[ks][mt][q], a_lo[ks][mt][q]);
          } else {
            mul2_split<T>(both, lastf[mt][hf], a[ks][mt][q], a_lo[ks][mt][q]);
          }
        }
      const uint64_t desc_hi = kmajor_desc(bt + ks * 2 * kChunk, kChunk * sizeof(T), 128);
      const uint64_t desc_lo = kmajor_desc(bt + b_size + ks * 2 * kChunk, kChunk * sizeof(T), 128);
      wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) wgmma_rs_split<T, N>(acc[mt], a[ks][mt], a_lo[ks][mt], desc_hi, desc_lo);
      wgmma_commit();
    }
    // This warpgroup's products of the previous step are complete (the last wait above). The next
    // block goes to the buffer of step - 1 (two buffers: once the other warpgroup's products are
    // complete too) or step - 2 (three: its products completed before the last barrier).
    if constexpr (kBuffers == 2) __syncthreads();
    if (step + 1 < steps) store_step(step + 1, static_cast<int>((step + 1) % kBuffers));
    cur = next;
    copy_async_wait<kRawStages - 2>();  // rows of step + 2, table entries of step + R + 1
    fence_async_shared();
    __syncthreads();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) wgmma_pin(acc[mt]);

  store_blocked_outputs<T, E, MT>(P, at, acc, wg, [](int, int) { return 1.f; });
}

}  // namespace expanse_cuda
