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
// F16 = true: one f16 product per step instead (a third of the tensor work, no split): the state rows
// are rounded once to f16 times their column's power-of-two scale (kernels/portable/state_scales.cuh,
// computed by a pass before this kernel), and the query tile is converted to f16 in place, each
// token's row times a power of two that keeps |phi| under 2^15. f16's 11 bits keep the strongly gated
// inputs within SPEC's bf16 bound where bf16's 8 do not; both scales are undone in the epilogue.
//
// CTA: 2 warpgroups x MT m64 tiles = 128 MT tokens of one chunk x all e, one query head; K steps of
// one block. The state rows of a block (and its z entries) arrive by cp.async R steps ahead in a
// ring of raw f32 stages, located by the block's table entries, which arrive before that in a ring
// of their own; one pass per step splits a raw stage into the hi and lo B tiles of a ring of B
// buffers. (Loads into register stages had stalled the step on their results: at 255 registers the
// compiler kept them close to their use.) Keep ptxas's C7515 line away from this kernel: it means
// that every wgmma was serialized (docs/performance.md).
#pragma once

#include "kernels/sm90/wgmma_query_state.cuh"

namespace expanse_cuda {

namespace blocked_query_state_cfg {
// B tiles per buffer: hi and lo, or the f16 tile alone.
template <bool F16>
constexpr int tiles_per_buffer() { return F16 ? 1 : 2; }
// Raw stages: at step s the rows of block s + 1 are split, those of s + 2 .. s + R - 1 are landing and
// those of s + R are issued (R = 3 where four stages would not fit, at e = 128).
template <int E>
constexpr int raw_stages() { return E <= 64 ? 4 : 3; }
// Table entries are issued 2 R - 1 steps ahead, so that they have landed when their rows are issued,
// and live until the step before their block.
template <int E>
constexpr int table_ahead() { return 2 * raw_stages<E>() - 1; }
// B tiles (hi + lo) per buffer ring: with three, a step splits the next block into the buffer of
// the step before last, whose products are complete, without waiting for the other warpgroup.
template <int E>
constexpr int b_buffers() { return E <= 64 ? 3 : 2; }
// m64 tiles per warpgroup: 256 tokens per CTA where the accumulators' registers and the query tile's
// shared memory allow it.
template <int E>
constexpr int token_tiles(int d) { return E <= 64 && d <= 128 ? 2 : 1; }
constexpr int kTableStages = 8;
static_assert(table_ahead<64>() + 1 <= kTableStages && table_ahead<128>() + 1 <= kTableStages, "table ring");
template <int E>
constexpr size_t raw_stage_bytes() { return size_t(wgmma_query_state_cfg::kRowsK) * (E + 1) * sizeof(float); }
constexpr size_t table_stage_bytes() { return size_t(wgmma_query_state_cfg::kRowsK) * sizeof(phi_block_row); }
}  // namespace blocked_query_state_cfg

template <class T, int E, int MT, bool F16>
constexpr size_t blocked_query_state_smem(int d) {
  using namespace wgmma_query_state_cfg;
  using namespace blocked_query_state_cfg;
  return tiles_per_buffer<F16>() * b_buffers<E>() * size_t(b_tile_elems<E + 8>()) * sizeof(T) +
         size_t(128 * MT) * (d + 8) * sizeof(T) + raw_stages<E>() * raw_stage_bytes<E>() +
         kTableStages * table_stage_bytes() + (F16 ? (E + 1 + 128 * MT) * sizeof(float) : 0);
}

// The F16 form's query tile: each token's row of x (kTok rows of d, type T) rewritten in place as f16
// times 2^s, with s such that |x 2^s| < 2^(15 / p) (so |phi| < 2^15), the column of ones at d as f16
// ones; token_unscale[row] = 2^(-p s), the factor that undoes the scale of phi.
template <class T, int kTok>
__device__ __forceinline__ void scale_query_tile_to_f16(T* qs, int qs_stride, int d, int p, float* token_unscale) {
  for (int row = threadIdx.x; row < kTok; row += blockDim.x) {
    T* x = qs + row * qs_stride;
    float mx = 0.f;
    for (int c = 0; c < d; ++c) mx = fmaxf(mx, fabsf(to_f32(x[c])));
    int ex = 0;
    frexpf(mx, &ex);  // mx < 2^ex
    const int s = mx > 0.f && isfinite(mx) ? max(-60, min(60, 15 / p - ex)) : 0;
    const float f = ldexpf(1.f, s);
    __half* h = reinterpret_cast<__half*>(x);
    for (int c = 0; c < d; ++c) h[c] = __float2half_rn(to_f32(x[c]) * f);
    h[d] = __float2half_rn(1.f);
    token_unscale[row] = ldexpf(1.f, -p * s);
  }
}

// PM: 2 for p = 2 (fixed factors ignored), 4 for p = 3, 4 (fixed index d reads a column of ones).
template <class T, int E, int PM, int MT, bool F16>
__global__ void __launch_bounds__(256, 1) blocked_query_state_kernel(mma_query_state_params P) {
  using namespace wgmma_query_state_cfg;
  static_assert(kRowsK == 64, "one phi block per K step");
  constexpr int kTok = 128 * MT;
  constexpr int N = E + 8;
  constexpr int kNT = E / 8;  // 8-column blocks of the state; block kNT is the z tile
  constexpr int kChunk = chunk_elems<N>();
  constexpr int b_size = b_tile_elems<N>();
  constexpr int kRowPairs = kRowsK / 2;
  constexpr int kItems = kRowPairs * E / 4;  // (row pair, 4 columns) per item
  constexpr int kMaxItems = (kItems + kThreads - 1) / kThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = P.d, qs_stride = d + 8;
  constexpr int kBuffers = blocked_query_state_cfg::b_buffers<E>();
  constexpr int kTilesPerBuffer = blocked_query_state_cfg::tiles_per_buffer<F16>();
  using B = std::conditional_t<F16, __half, T>;  // the tensor cores' operand type
  // The buffers of B tiles (hi, lo or f16), then the query tile (x, then x 2^s in f16 when F16).
  B* const bt0 = reinterpret_cast<B*>(smem_raw);
  T* const qs = reinterpret_cast<T*>(bt0 + kTilesPerBuffer * kBuffers * b_size);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const query_tile at = decode_query_tile(P, kTok);
  if (at.ntok <= 0) return;
  const int64_t qh = at.qh, m = at.chunk, batch = at.batch, kv = at.kv, bh = at.bh, tok0 = at.tok0, ntok = at.ntok;

  init_query_tiles<T, kTok, kNT, kChunk>(P, qs, qs_stride, batch, qh, tok0, ntok, reinterpret_cast<T*>(bt0),
                                         kTilesPerBuffer * kBuffers, b_size);

  // Rings after the query tile: raw stages (rows [64][E] f32, 16-byte chunk c of row r at
  // c ^ ((r / 2) % chunks) for conflict-free reads of row pairs, then z [64]), table stages.
  using namespace blocked_query_state_cfg;
  constexpr int kRawStages = raw_stages<E>(), kTableAhead = table_ahead<E>();
  constexpr int kRawBytes = int(raw_stage_bytes<E>());
  unsigned char* const raw0 = reinterpret_cast<unsigned char*>(qs + 128 * MT * qs_stride);
  const phi_block_row* const tab0 = reinterpret_cast<const phi_block_row*>(raw0 + kRawStages * kRawBytes);
  // F16: the state's column scales (e, then z), then each token's unscale factor.
  float* const col_scale = reinterpret_cast<float*>(const_cast<phi_block_row*>(tab0) + kTableStages * kRowsK);
  float* const token_unscale = col_scale + (E + 1);
  constexpr int kRowChunks = E / 4;  // 16-byte chunks per state row
  auto swz = [](int r, int c) { return c ^ ((r >> 1) & (kRowChunks - 1)); };
  const float* Sbase = P.S + batch * P.S_sb + m * P.S_sn + kv * P.S_sh;
  const float* zbase = P.z ? P.z + batch * P.z_sb + m * P.z_sn + kv * P.z_sh : nullptr;
  const int64_t steps = P.blocks.count;
  auto table_stage = [&](int64_t blk) { return tab0 + (blk % kTableStages) * kRowsK; };
  auto raw_stage = [&](int64_t blk) { return raw0 + (blk % kRawStages) * kRawBytes; };
  // The table entries of block blk: 512 bytes, 16 per thread of the first 32.
  auto issue_table = [&](int64_t blk) {
    if (blk < steps && tid < kRowsK * int(sizeof(phi_block_row)) / 16)
      copy_async<16>(const_cast<phi_block_row*>(table_stage(blk)) + 2 * tid, P.blocks.row + blk * kRowsK + 2 * tid, true);
  };
  // The state rows and z entries of block blk (zeros for padding rows), by its table stage.
  constexpr int kCopies = kRowsK * kRowChunks / kThreads;
  static_assert(kCopies * kThreads == kRowsK * kRowChunks, "whole copies per thread");
  auto issue_rows = [&](int64_t blk) {
    if (blk >= steps) return;
    const phi_block_row* tab = table_stage(blk);
    unsigned char* raw = raw_stage(blk);
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int i = tid + j * kThreads, r = i / kRowChunks, c = i % kRowChunks;
      const int32_t row = tab[r].row;
      copy_async<16>(raw + (r * kRowChunks + swz(r, c)) * 16, row >= 0 ? Sbase + int64_t(row) * P.S_sD + c * 4 : Sbase,
                     row >= 0);
    }
    if (tid < kRowsK) {
      const int32_t row = tab[tid].row;
      const bool in = zbase != nullptr && row >= 0;
      copy_async<4>(raw + kRowsK * E * 4 + tid * 4, in ? zbase + int64_t(row) * P.z_sD : nullptr, in);
    }
  };
  // Raw stage of block blk -> hi and lo B tiles of buffer buf, times the rows' coefficients. Row
  // pair rp lies in chunk rp / 4 at word rp % 4 of each core-matrix row; the lo tile follows hi.
  auto store_step = [&](int64_t blk, int buf) {
    const unsigned char* raw = raw_stage(blk);
    const phi_block_row* tab = table_stage(blk);
    uint32_t* const bw = reinterpret_cast<uint32_t*>(bt0 + kTilesPerBuffer * buf * b_size);
    constexpr int lo = b_size / 2;  // words
    // All of this thread's reads first, then the products and stores (the compiler cannot move a
    // shared-memory read above a shared-memory store).
    static_assert(kItems % kThreads == 0, "whole items per thread");
    float4 s0[kMaxItems], s1[kMaxItems];
    float k0[kMaxItems], k1[kMaxItems];
#pragma unroll
    for (int i = 0; i < kMaxItems; ++i) {
      const int item = tid + i * kThreads, rp = item % kRowPairs, c4 = item / kRowPairs;
      s0[i] = *reinterpret_cast<const float4*>(raw + ((2 * rp) * kRowChunks + swz(2 * rp, c4)) * 16);
      s1[i] = *reinterpret_cast<const float4*>(raw + ((2 * rp + 1) * kRowChunks + swz(2 * rp + 1, c4)) * 16);
      k0[i] = tab[2 * rp].coef;
      k1[i] = tab[2 * rp + 1].coef;
    }
#pragma unroll
    for (int i = 0; i < kMaxItems; ++i) {
      const int item = tid + i * kThreads, rp = item % kRowPairs, c4 = item / kRowPairs;
      const float* v0 = reinterpret_cast<const float*>(&s0[i]);
      const float* v1 = reinterpret_cast<const float*>(&s1[i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = c4 * 4 + j;
        uint32_t* out = bw + (rp / 4) * (kChunk / 2) + (col / 8) * 32 + (col % 8) * 4 + rp % 4;
        if constexpr (F16) out[0] = pack2_f32<__half>(v0[j] * k0[i] * col_scale[col], v1[j] * k1[i] * col_scale[col]);
        else split2_f32<T>(v0[j] * k0[i], v1[j] * k1[i], out[0], out[lo]);
      }
    }
    if (tid < kRowPairs) {  // the z entries of row pair tid
      const float* z = reinterpret_cast<const float*>(raw + kRowsK * E * 4);
      uint32_t* out = bw + (tid / 4) * (kChunk / 2) + kNT * 32 + tid % 4;
      const float z0 = z[2 * tid] * tab[2 * tid].coef, z1 = z[2 * tid + 1] * tab[2 * tid + 1].coef;
      if constexpr (F16) out[0] = pack2_f32<__half>(z0 * col_scale[E], z1 * col_scale[E]);
      else split2_f32<T>(z0, z1, out[0], out[lo]);
    }
  };

  float acc[MT][N / 2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[mt][i] = 0.f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) wgmma_pin(acc[mt]);

  // This lane's tokens: rows g and g + 8 (hf) of its warp's 16 in each of its warpgroup's m64 tiles.
  using Q = B;  // the query tile's type from here on
  const Q* qrow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      qrow[mt][hf] = reinterpret_cast<const Q*>(qs + ((mt * 2 + wg) * 64 + wq * 16 + hf * 8 + g) * qs_stride);

  // Prologue: the table entries of blocks 0 .. kTableAhead - 1, then the rows of blocks 0 .. R - 1
  // (one group each); block 0 split into buffer 0, block 1 landed.
  for (int64_t b = 0; b < kTableAhead; ++b) issue_table(b);
  copy_async_commit();
  if constexpr (F16) {
    if (tid <= E) col_scale[tid] = P.state_scales[((batch * P.n + m) * P.h + kv) * (E + 1) + tid];
    __syncthreads();  // the query tile is complete
    scale_query_tile_to_f16<T, kTok>(qs, qs_stride, d, P.p, token_unscale);
  }
  copy_async_wait<0>();
  __syncthreads();
  for (int64_t b = 0; b < kRawStages; ++b) {
    issue_rows(b);
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
  uint32_t a[kRowsK / 16][MT][4], a_lo[kRowsK / 16][MT][F16 ? 1 : 4];
  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step % kBuffers);
    // One group per step: the table entries of step + 2 R - 1 and the rows of step + R (whose table
    // entries have landed).
    issue_table(step + kTableAhead);
    issue_rows(step + kRawStages);
    copy_async_commit();
    const phi_block next = step + 1 < steps ? P.blocks.block[step + 1] : cur;
    const B* bt = bt0 + kTilesPerBuffer * buf * b_size;
    // Per token: x[mid .. mid + 7] and the pair at last + 2 tq times the fixed factors.
    uint4 mids[MT][2];
    uint32_t lastf[MT][2];
    float2 last32[MT][2];  // PM = 4: the pair times the fixed factors in f32 (exact: 24 bits)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const Q* row = qrow[mt][hf];
        mids[mt][hf] = *reinterpret_cast<const uint4*>(row + cur.mid);
        lastf[mt][hf] = *reinterpret_cast<const uint32_t*>(row + cur.last + 2 * tq);
        if constexpr (PM == 4) {
          const float f = to_f32(row[cur.fixed[0]]) * to_f32(row[cur.fixed[1]]);
          const Q* pair = reinterpret_cast<const Q*>(&lastf[mt][hf]);
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
          const uint32_t word = word_of(mids[mt][hf], G / 2);
          const uint32_t both = __byte_perm(word, word, (G & 1) ? 0x3232 : 0x1010);  // x[mid + G] twice
          if constexpr (PM == 4) {
            // Four factors: the product in f32 (one rounding, 2^-24), then split (b16 products of b16
            // pairs would round twice more, 2^-9 each, the whole bf16 budget on strongly gated inputs).
            const float xm = to_f32(reinterpret_cast<const Q*>(&word)[G & 1]);
            if constexpr (F16) a[ks][mt][q] = pack2_f32<__half>(xm * last32[mt][hf].x, xm * last32[mt][hf].y);
            else split2_f32<T>(xm * last32[mt][hf].x, xm * last32[mt][hf].y, a[ks][mt][q], a_lo[ks][mt][q]);
          } else {
            // F16: the product of two f16 values rounded once (the f16 tile keeps x exactly).
            if constexpr (F16) a[ks][mt][q] = mul2<__half>(both, lastf[mt][hf]);
            else mul2_split<T>(both, lastf[mt][hf], a[ks][mt][q], a_lo[ks][mt][q]);
          }
        }
      const uint64_t desc_hi = kmajor_desc(bt + ks * 2 * kChunk, kChunk * sizeof(B), 128);
      wgmma_fence();
      if constexpr (F16) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) wgmma_rs<__half, N>(acc[mt], a[ks][mt], desc_hi);
      } else {
        const uint64_t desc_lo = kmajor_desc(bt + b_size + ks * 2 * kChunk, kChunk * sizeof(B), 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          wgmma_rs<T, N>(acc[mt], a[ks][mt], desc_hi);
          wgmma_rs<T, N>(acc[mt], a[ks][mt], desc_lo);
          wgmma_rs<T, N>(acc[mt], a_lo[ks][mt], desc_hi);
        }
      }
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

  // Epilogue: decay, scale^p, the intra-chunk term, normalization (den: column E, held by tq = 0).
  T* obase = static_cast<T*>(P.o) + batch * P.o_sb + qh * P.o_sh;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int local = (mt * 2 + wg) * 64 + wq * 16 + hf * 8 + g;
      // F16: the sums times 1 / (token scale x column scale), both powers of two.
      const float tu = F16 ? token_unscale[local] : 1.f;
      float den = __shfl_sync(0xffffffffu, acc[mt][4 * kNT + 2 * hf], lane & ~3);
      if constexpr (F16) den *= tu / col_scale[E];
      if (local >= ntok) continue;
      store_query_output<T, kNT>(P, obase, batch, qh, bh, tok0 + local, tq, den, [&](int nt, int u) {
        if constexpr (F16) return acc[mt][4 * nt + 2 * hf + u] * (tu / col_scale[nt * 8 + 2 * tq + u]);
        else return acc[mt][4 * nt + 2 * hf + u];
      });
    }
}

}  // namespace expanse_cuda
