// dv's state term in power_attention_backward on Hopper (wgmma, sm_90a), p = 2, d = e = 64:
//   out_j = phi(k_j)^T dY        (dY the cotangent of the state leaving key j's chunk)
// from the tiles the keys' state pullback made of dY (kernels/sm80/mma_state_pullback.cuh,
// split_state_tiles_kernel): tile (A, B) holds the rows (a, b) = (8 A + tr / 8, 8 B + tr % 8) times
// c_ab, split into b16 hi + lo, zero where a > b. So phi(k_j) restricted to a tile is k_a k_b
// without its coefficient, and out_j = sum over tiles of [k_a k_b]_tr T[tr, :]: per tile an
// m64n64k64 product with K the tile's rows, whose B is the tile read N-major (its 8-column runs are
// contiguous; nmajor_desc).
//
// Accuracy as the split query_state (blocked_query_state.cuh): k_a k_b is exact as b16 hi + lo
// (mul2_split), and each slice multiplies A_hi T_hi + A_hi T_lo + A_lo T_hi; a b16 rounding of either
// operand is magnified where dY cancels (docs/performance.md, accuracy lesson 9).
//
// Against query_state on the f32 state: no CTA gathers or splits state rows (the pullback's pass did,
// once per chunk and head), and the tiles arrive by cp.async two ahead in a ring of four.
//
// CTA: 2 warpgroups, 128 keys of one chunk and kv head (64 per warpgroup), all e columns; two CTAs
// per SM.
#pragma once

#include "kernels/sm80/mma_state_pullback.cuh"
#include "kernels/sm90/wgmma.cuh"
#include "kernels/sm90/wgmma_state_pullback.cuh"

namespace expanse_cuda {

struct tiles_query_params {
  const void* k;  // [b,t,h,d], the input dtype, last dim contiguous
  int64_t k_sb, k_st, k_sh;
  const void* tiles;  // per (batch, chunk, kv head): split_state_tiles_kernel's tiles of dY
  expanse_tensor out;  // [b,t,h,e], the input dtype, last dim contiguous: written
  int64_t t, c, n, h;
  int token_tiles;
};

namespace tiles_query_cfg {
constexpr int kThreads = 256, kRows = 128, kBuffers = 4, kAhead = 2;
}

template <class T, int DH, int E>
constexpr size_t tiles_query_smem() {
  using namespace tiles_query_cfg;
  return size_t(kBuffers) * 2 * wgmma_pullback_tiles<T, E>::kElems * sizeof(T) + size_t(kRows) * (DH + 8) * sizeof(T);
}

template <class T, int DH, int E>
__global__ void __launch_bounds__(256, 2) state_tiles_query_kernel(tiles_query_params P) {
  using namespace tiles_query_cfg;
  using Tiles = wgmma_pullback_tiles<T, E>;
  static_assert(DH == 64 && E == 64, "state_tiles_query_kernel: d = e = 64");
  constexpr int kBlocks = DH / 8, kTiles = pullback_cfg::state_tiles<2, DH>(), kKS = DH + 8;
  constexpr int kImage = 2 * Tiles::kElems;  // elements of a tile's hi and lo
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const ring = reinterpret_cast<T*>(smem_raw);  // kBuffers tile images
  T* const ks = ring + kBuffers * kImage;          // [kRows][kKS]: the keys

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const cta_coords at = decode_cta(P.token_tiles, P.h, P.n);
  const int64_t kv = at.head, m = at.chunk, batch = at.batch;
  const int64_t first = m * P.c, len = min(P.c, P.t - first);
  const int r0 = at.tile * kRows;
  if (r0 >= len) return;

  const T* tile0 = static_cast<const T*>(P.tiles) + ((batch * P.n + m) * P.h + kv) * kTiles * kImage;
  auto copy_tile = [&](int tile) {  // one cp.async group, empty past the last tile
    if (tile < kTiles) copy_async_chunks<kImage / 8, kThreads>(ring + (tile % kBuffers) * kImage, tile0 + int64_t(tile) * kImage, tid);
    copy_async_commit();
  };
  for (int tile = 0; tile < kAhead; ++tile) copy_tile(tile);

  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + kv * P.k_sh;
  for (int vi = tid; vi < kRows * DH / 8; vi += kThreads) {
    const int s = vi / (DH / 8), c8 = vi % (DH / 8);
    *reinterpret_cast<uint4*>(ks + s * kKS + c8 * 8) =
        r0 + s < len ? *reinterpret_cast<const uint4*>(kbase + (first + r0 + s) * P.k_st + c8 * 8) : make_uint4(0, 0, 0, 0);
  }
  // This lane's rows g and g + 8 of its warp's 16 (the warpgroup's m64 tile).
  const T* krow[2] = {ks + (warp * 16 + g) * kKS, ks + (warp * 16 + g + 8) * kKS};

  float acc[E / 2];
#pragma unroll
  for (int i = 0; i < E / 2; ++i) acc[i] = 0.f;
  wgmma_pin(acc);
  uint4 ka[2];  // k[row][8 A .. 8 A + 7] of the current block A
  uint32_t hi[4][4], lo[4][4];  // the tile's A registers
  int A = 0, B = 0;
#pragma unroll 1
  for (int tile = 0; tile < kTiles; ++tile) {
    copy_async_wait<kAhead - 1>();  // this tile's copies (the next one's may still run)
    fence_async_shared();
    // This tile and the keys are visible; every warpgroup has finished the products of tile - 1
    // (its wait below), and so of tile - 2, whose buffer the copy of tile + 2 reuses.
    __syncthreads();
    copy_tile(tile + kAhead);
    if (B == A) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) ka[hf] = *reinterpret_cast<const uint4*>(krow[hf] + 8 * A);
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint32_t kb = *reinterpret_cast<const uint32_t*>(krow[hf] + 8 * B + 2 * tq);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // A register hf + 2 half: feature a = 8 A + 2 kk + half
          const int q = hf + 2 * half;
          mul2_split<T>(b16_twice(word_of(ka[hf], kk), half), kb, hi[kk][q], lo[kk][q]);
        }
    }
    const T* tile_hi = ring + (tile % kBuffers) * kImage;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t dhi = nmajor_desc(tile_hi + kk * 16 * 8, 128, Tiles::kKStride * sizeof(T));
      const uint64_t dlo = nmajor_desc(tile_hi + Tiles::kElems + kk * 16 * 8, 128, Tiles::kKStride * sizeof(T));
      wgmma_rs_split<T, E, true>(acc, hi[kk], lo[kk], dhi, dlo);
    }
    wgmma_commit();
    // The A registers are rewritten for the next tile: the other warpgroup and CTA keep the tensor
    // cores busy meanwhile (two sets of A registers in flight spilled 184 bytes at 128 registers).
    wgmma_wait<0>();
    if (++B == kBlocks) B = ++A;
  }
  wgmma_wait<0>();
  wgmma_pin(acc);

  // D rows g, g + 8 of this warp's 16, columns 8 j + 2 tq (+1).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = warp * 16 + g + 8 * hf;
    if (r0 + r >= len) continue;
    T* o = static_cast<T*>(P.out.data) + off4(P.out, batch, first + r0 + r, kv, 0);
#pragma unroll
    for (int j = 0; j < E / 8; ++j)
      *reinterpret_cast<uint32_t*>(o + j * 8 + 2 * tq) = pack2_f32<T>(acc[4 * j + 2 * hf], acc[4 * j + 2 * hf + 1]);
  }
}

}  // namespace expanse_cuda
