// update_state as expand-MMA on Hopper (wgmma, sm_90a) for expansions in phi blocks (kernels/common.cuh):
// the GEMM of wgmma_update_state.cuh (M = rows of phi, N = e + 8 with the z column, K = tokens,
// B = the gated values in shared memory), with the A operand formed from far fewer shared-memory
// reads. Each m64 tile of a warpgroup is one phi block, whose row 8 G + l is
//   x[fixed0] x[fixed1] x[mid + G] x[last + l];
// a lane's two fragment rows (g and g + 8) are rows (G = 2 wq, l = g) and (G = 2 wq + 1, l = g), so
// both multiply the same key feature last + g, and the mid feature is the same for the 8 lanes g of
// a row half (a broadcast read). The key tile stores each feature's 64 tokens in the order the lanes
// use them (tq's 16 tokens contiguous): one 16-byte read gives 4 token pairs. Per A register that is
// 0.75 shared-memory wavefronts at p = 2, against 2 when every fragment row gathers its own factors.
//
// CTA: 2 warpgroups x 2 m64 tiles = 4 phi blocks (256 rows) x all e columns, one chunk of one head;
// K steps of 64 tokens, double-buffered in shared memory as in wgmma_update_state.cuh. The raw key
// and value rows of each step arrive by cp.async three steps ahead, in a ring of four stages
// (coalesced 16-byte copies, no staging registers); one pass per step turns a raw stage into the
// key tile and the gated B tile. Loads in registers spread over 32 rows per warp instruction had
// kept the L1 busiest of all units.
#pragma once

#include "kernels/sm90/wgmma_update_state.cuh"

namespace expanse_cuda {

namespace blocked_update_state_cfg {
constexpr int kBlocksPerCta = 4;
// The word (pair of tokens) that holds tokens 2 sp, 2 sp + 1 of a step in a feature row of the key
// tile: lane tq's tokens 16 ks + 8 h + 2 tq (+1) lie at words 8 tq + 2 ks + h.
__device__ __forceinline__ int token_pair_word(int sp) { return (sp % 4) * 8 + (sp / 8) * 2 + (sp % 8) / 4; }
}  // namespace blocked_update_state_cfg

namespace blocked_update_state_cfg {
constexpr int kRawStages = 4;  // ring of raw stages: copies run kRawStages - 1 steps ahead
// A raw stage: keys [64][DH] and values [64][E] as in memory, 16-byte chunks of row s at chunk
// c ^ ((s / 2) % chunks) (conflict-free reads of token pairs), then the tokens' Gc (f32).
template <class T, int DH, int E>
constexpr size_t raw_stage_bytes() { return size_t(wgmma_update_state_cfg::kTok) * ((DH + E) * sizeof(T) + 4); }
}  // namespace blocked_update_state_cfg

template <class T, int DH, int E>
constexpr size_t blocked_update_state_smem() {
  using namespace wgmma_update_state_cfg;
  return 2 * (size_t(DH + 1) * kTokPad + size_t(b_tile_elems<E + 8>())) * sizeof(T) +
         blocked_update_state_cfg::kRawStages * blocked_update_state_cfg::raw_stage_bytes<T, DH, E>();
}

// PM: 2 for p = 2 (fixed factors ignored), 4 for p = 3, 4 (fixed factors past p read a row of ones).
template <class T, int DH, int E, int PM>
__global__ void __launch_bounds__(256, 1) blocked_update_state_kernel(mma_update_state_params P) {
  using namespace wgmma_update_state_cfg;
  using blocked_update_state_cfg::token_pair_word;
  constexpr int N = E + 8;    // e columns + the z tile
  constexpr int kNT = E / 8;  // 8-column blocks of v; block kNT is the z tile
  constexpr int kChunk = chunk_elems<N>();
  constexpr int d = DH;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Two buffers each: keys [d+1][kTokPad] (feature rows in lane order; row d is ones), B tiles.
  T* const kT0 = reinterpret_cast<T*>(smem_raw);
  constexpr int kT_size = (d + 1) * kTokPad;
  constexpr int b_size = b_tile_elems<N>();
  T* const vb0 = kT0 + 2 * kT_size;
  static_assert((2 * kT_size * sizeof(T)) % 16 == 0, "the B tile must start 16-byte aligned");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const cta_coords at = decode_cta(P.row_tiles, P.h, P.n);
  const int row_tile = at.tile;
  const int64_t head = at.head, m = at.chunk, batch = at.batch;
  const int64_t first = m * P.c, len = min(P.c, P.t - first), bh = batch * P.h + head;
  const float A = P.g.chunk_total(bh, P.n, m);

  // This lane's key rows per m64 tile (element offsets of its 16 tokens in a feature row).
  int last_off[2], mid_off[2][2], fixed_off[2][2];
  int64_t block[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    block[mt] = int64_t(row_tile) * blocked_update_state_cfg::kBlocksPerCta + wg * 2 + mt;
    phi_block b{{uint16_t(d), uint16_t(d)}, 0, 0};  // past the last block: any rows, never stored
    if (block[mt] < P.blocks.count) b = P.blocks.block[block[mt]];
    last_off[mt] = (b.last + g) * kTokPad + tq * 16;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      mid_off[mt][hf] = (b.mid + 2 * wq + hf) * kTokPad + tq * 16;
      fixed_off[mt][hf] = b.fixed[hf] * kTokPad + tq * 16;
    }
  }

  // Once: the ones row and the z tiles of both buffers (only their row 0 changes).
  for (int i = tid; i < kTokPad; i += kThreads)
#pragma unroll
    for (int buf = 0; buf < 2; ++buf) kT0[buf * kT_size + d * kTokPad + i] = from_f32<T>(1.f);
  for (int i = tid; i < 2 * (kTok / 8) * 64; i += kThreads) {
    const int buf = i / ((kTok / 8) * 64), rest = i % ((kTok / 8) * 64), chunk = rest / 64;
    vb0[buf * b_size + chunk * kChunk + kNT * 64 + rest % 64] = from_f32<T>(0.f);
  }

  // Raw stages after the key and B buffers.
  using blocked_update_state_cfg::kRawStages;
  constexpr int kRawBytes = int(blocked_update_state_cfg::raw_stage_bytes<T, d, E>());
  unsigned char* const raw0 = reinterpret_cast<unsigned char*>(vb0 + 2 * b_size);
  constexpr int kKeyChunks = d / 8, kValChunks = E / 8;  // 16-byte chunks per row
  auto swz = [](int s, int c, int chunks) { return c ^ ((s >> 1) & (chunks - 1)); };
  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + head * P.k_sh;
  const T* vbase = static_cast<const T*>(P.v) + batch * P.v_sb + head * P.v_sh;
  // Every loop over a thread's items below has a trip count known at compile time, and the
  // per-thread parts of its addresses are computed once here: the step loop then does no index
  // arithmetic beyond one add per copy (generic tid-strided loops had compiled to nested loops with
  // remainders, a third of the step's instructions).
  constexpr int kKeyCopies = kTok * kKeyChunks / kThreads, kValCopies = kTok * kValChunks / kThreads;
  static_assert(kKeyCopies * kThreads == kTok * kKeyChunks && kValCopies * kThreads == kTok * kValChunks,
                "whole copies per thread");
  struct copy_slot {
    const T* src;   // the element of the chunk's first step
    int dst;        // byte offset inside a raw stage
    int token;      // token of the step
  };
  copy_slot kcopy[kKeyCopies], vcopy[kValCopies];
#pragma unroll
  for (int j = 0; j < kKeyCopies; ++j) {
    const int i = tid + j * kThreads, s = i / kKeyChunks, c = i % kKeyChunks;
    kcopy[j] = {kbase + (first + s) * P.k_st + c * 8, int(sizeof(T)) * (s * d + swz(s, c, kKeyChunks) * 8), s};
  }
#pragma unroll
  for (int j = 0; j < kValCopies; ++j) {
    const int i = tid + j * kThreads, s = i / kValChunks, c = i % kValChunks;
    vcopy[j] = {vbase + (first + s) * P.v_st + c * 8, int(sizeof(T)) * (kTok * d + s * E + swz(s, c, kValChunks) * 8), s};
  }
  const int64_t k_step = int64_t(kTok) * P.k_st, v_step = int64_t(kTok) * P.v_st;
  const float* gc_src = P.g.Gc ? P.g.Gc + bh * P.t + first + tid : nullptr;
  constexpr int kGcOffset = kTok * (d + E) * int(sizeof(T));
  // Issues the copies of step `step` into its raw stage (zeros past the chunk) and commits them as
  // one group (an empty group past the last step, so that every step commits one).
  const int64_t steps = (len + kTok - 1) / kTok;
  auto issue_step = [&](int64_t step) {
    if (step < steps) {
      unsigned char* raw = raw0 + (step % kRawStages) * kRawBytes;
      const int64_t s0 = step * kTok;
#pragma unroll
      for (int j = 0; j < kKeyCopies; ++j) {
        const bool in = s0 + kcopy[j].token < len;
        copy_async<16>(raw + kcopy[j].dst, in ? kcopy[j].src + step * k_step : kbase, in);
      }
#pragma unroll
      for (int j = 0; j < kValCopies; ++j) {
        const bool in = s0 + vcopy[j].token < len;
        copy_async<16>(raw + vcopy[j].dst, in ? vcopy[j].src + step * v_step : vbase, in);
      }
      if (tid < kTok) {
        const bool in = gc_src != nullptr && s0 + tid < len;
        copy_async<4>(raw + kGcOffset + 4 * tid, in ? gc_src + s0 : nullptr, in);
      }
    }
    copy_async_commit();
  };
  auto gate = [&](int64_t s, float gc) { return s < len ? (P.g.Gc ? __expf(A - gc) : 1.f) : 0.f; };
  // Raw stage of step `step` -> key tile (feature rows, token pairs in lane order) and B tile (gated
  // values and the z tile) of buffer buf, by pairs of tokens: key items one 8-feature chunk, value
  // items one 8-column chunk.
  constexpr int kPairs = kTok / 2;
  constexpr int kKeyItems = kPairs * d / 8, kValItems = kPairs * E / 8;
  constexpr int kMaxKey = (kKeyItems + kThreads - 1) / kThreads, kMaxVal = (kValItems + kThreads - 1) / kThreads;
  auto store_step = [&](int64_t step, int buf) {
    const unsigned char* raw = raw0 + (step % kRawStages) * kRawBytes;
    const T* rk = reinterpret_cast<const T*>(raw);
    const T* rv = rk + kTok * d;
    const float* rg = reinterpret_cast<const float*>(rv + kTok * E);
    T* const kb = kT0 + buf * kT_size;
    uint32_t* const vw = reinterpret_cast<uint32_t*>(vb0 + buf * b_size);
#pragma unroll
    for (int i = 0; i < kMaxKey; ++i) {
      const int item = tid + i * kThreads, sp = item % kPairs, c8 = item / kPairs;
      if (kKeyItems % kThreads != 0 && item >= kKeyItems) break;
      const uint4 k0 = *reinterpret_cast<const uint4*>(rk + (2 * sp) * d + swz(2 * sp, c8, kKeyChunks) * 8);
      const uint4 k1 = *reinterpret_cast<const uint4*>(rk + (2 * sp + 1) * d + swz(2 * sp + 1, c8, kKeyChunks) * 8);
      const T* e0 = reinterpret_cast<const T*>(&k0);
      const T* e1 = reinterpret_cast<const T*>(&k1);
      uint32_t* out = reinterpret_cast<uint32_t*>(kb + c8 * 8 * kTokPad) + token_pair_word(sp);
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j * (kTokPad / 2)] = pack2(e0[j], e1[j]);
    }
    // Token pair sp lies in chunk sp / 4 at word sp % 4 of each core-matrix row of the B tile.
    const int64_t s0 = step * kTok;
#pragma unroll
    for (int i = 0; i < kMaxVal; ++i) {
      const int item = tid + i * kThreads, sp = item % kPairs, c8 = item / kPairs;
      if (kValItems % kThreads != 0 && item >= kValItems) break;
      const uint4 v0 = *reinterpret_cast<const uint4*>(rv + (2 * sp) * E + swz(2 * sp, c8, kValChunks) * 8);
      const uint4 v1 = *reinterpret_cast<const uint4*>(rv + (2 * sp + 1) * E + swz(2 * sp + 1, c8, kValChunks) * 8);
      const T* e0 = reinterpret_cast<const T*>(&v0);
      const T* e1 = reinterpret_cast<const T*>(&v1);
      const float w0 = gate(s0 + 2 * sp, rg[2 * sp]), w1 = gate(s0 + 2 * sp + 1, rg[2 * sp + 1]);
      uint32_t* out = vw + (sp / 4) * (kChunk / 2) + c8 * 32 + sp % 4;
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j * 4] = pack2_f32<T>(to_f32(e0[j]) * w0, to_f32(e1[j]) * w1);
      // Items c8 = 0 also fill the z tile with their gates.
      if (c8 == 0) vw[(sp / 4) * (kChunk / 2) + kNT * 32 + sp % 4] = pack2_f32<T>(w0, w1);
    }
  };

  float acc[2][N / 2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[mt][i] = 0.f;

  for (int i = 0; i < kRawStages - 1; ++i) issue_step(i);
  copy_async_wait<kRawStages - 2>();  // step 0's copies
  __syncthreads();
  store_step(0, 0);
  copy_async_wait<kRawStages - 3>();  // step 1's copies (read after the loop's first barrier)
  fence_async_shared();
  __syncthreads();
  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step & 1);
    issue_step(step + kRawStages - 1);
    const T* kb = kT0 + buf * kT_size;
    const T* vb = vb0 + buf * b_size;
    uint32_t a[kTok / 16][2][4];  // untouched until the step's products complete
    // Half j of the step (k16 steps 2j, 2j + 1): this lane's 16-byte slice of each factor row;
    // word 2 (ks % 2) + h of a slice is the token pair of A register (ks, h) (wgmma.cuh: register 2h + hf).
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint4 last[2], mid[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        last[mt] = *reinterpret_cast<const uint4*>(kb + last_off[mt] + 8 * j);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) mid[mt][hf] = *reinterpret_cast<const uint4*>(kb + mid_off[mt][hf] + 8 * j);
        if constexpr (PM == 4) {
          const uint4 f0 = *reinterpret_cast<const uint4*>(kb + fixed_off[mt][0] + 8 * j);
          const uint4 f1 = *reinterpret_cast<const uint4*>(kb + fixed_off[mt][1] + 8 * j);
          last[mt] = mul2x4<T>(last[mt], mul2x4<T>(f0, f1));
        }
      }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const int ks = 2 * j + kk;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int hf = q & 1, w = 2 * kk + (q >> 1);
            a[ks][mt][q] = mul2<T>(word_of(last[mt], w), word_of(mid[mt][hf], w));
          }
        const uint64_t desc = kmajor_desc(vb + ks * 2 * kChunk, kChunk * sizeof(T), 128);
        wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) wgmma_rs<T, N>(acc[mt], a[ks][mt], desc);
      }
    }
    wgmma_commit();
    if (step + 1 < steps) store_step(step + 1, buf ^ 1);
    copy_async_wait<kRawStages - 3>();  // step + 2's copies, read in the next step
    fence_async_shared();
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) wgmma_pin(acc[mt]);
    __syncthreads();
  }

  // Epilogue: each fragment row to its row of the layout (padding rows are dropped), times its
  // coefficient, f32 out.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    if (block[mt] >= P.blocks.count) continue;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const phi_block_row r = P.blocks.row[block[mt] * 64 + (2 * wq + hf) * 8 + g];
      if (r.row < 0) continue;
      store_state_row<kNT>(P, batch, m, head, r.row, r.coef, tq,
                           [&](int nt, int u) { return acc[mt][4 * nt + 2 * hf + u]; });
    }
  }
}

}  // namespace expanse_cuda
