// The states as ready f16 B tiles for the F16 query kernel (f16_query_state.cuh), written once per
// state by a pass before it, so that the kernel only copies whole tiles into shared memory.
//
// Scales: for every state (batch, chunk, kv head) and column (the e columns of S, then z), the power
// of two that takes the column's largest magnitude under 2^12, so that coef * S * scale stays under
// 2^15 in f16 (the layouts' coefficients are sqrt(multinomial) <= sqrt(4!) < 8 for p <= 4) while
// keeping 11 significant bits down to 2^-14. The epilogue undoes them exactly.
//
// Why f16: with one b16 product per K step, rounding phi(q) and S to bf16 (8 bits) costs up to
// 1.6e-2 relative error on strongly gated inputs (the terms of phi(q) . S cancel); f16's 11 bits
// keep them within SPEC's bf16 bound (docs/performance.md). f16's range is narrow: hence the scales.
//
// Tiles: one per phi block (kernels/common.cuh) and state, in the block order, each the B operand of
// one K step: 64 K rows (the block's rows, coef * S[row] * scale, zeros for padding rows) x N = e + 8
// columns (S's e, then z, then 7 zeros), as wgmma's K-major core matrices without padding: 8 chunks
// of 8 K rows, each N / 8 core matrices of 8 columns x 8 rows (128 bytes, a column's 8 rows
// contiguous).
//
// (For tiled:8, f16_state_tiles_clustered.cuh writes the same tiles faster.) Here, one CTA per
// (state, group of 8 columns; the last group is z): it copies its columns of every row
// (32-byte pieces) into shared memory, where they fit; finds the scales; then writes each tile's
// 16-byte column pieces of its group, gathering the rows by the block table.
#pragma once

#include <cuda_fp16.h>

#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

struct f16_state_tiles_params {
  const float* S;
  int64_t S_sb, S_sn, S_sh, S_sD;  // [b,n,h,D,e], e contiguous
  const float* z;                  // null: the z column is zero
  int64_t z_sb, z_sn, z_sh, z_sD;
  int64_t n, h, D;
  phi_blocks blocks;
  float* scales;   // [b,n,h][e + 1]: the e columns of S, then z
  __half* tiles;   // [b,n,h][blocks][f16_state_tiles_cfg::tile_elems<E>()]
  // The clustered form only (f16_state_tiles_clustered.cuh): b n h, and its buffers per CTA (1 or 2).
  int64_t states;
  int buffers;
};

namespace f16_state_tiles_cfg {
constexpr int kThreads = 512;
constexpr int kRowsK = 64;  // rows of a phi block
// Largest magnitude of a column after its scale: under 2^kScaleBits.
constexpr int kScaleBits = 12;
// Rows of a group kept in shared memory (8 floats each, 96 KB; 72 KB at P1, three CTAs per SM);
// larger states are read from global memory (L2) instead.
constexpr int kStagedRows = 3072;
// Where row r of the staged group starts: rows swapped within aligned fours (so D is rounded up to
// a multiple of 4), so that the rows r + 8 c of four K chunks, read by one warp, fall in different
// banks.
__host__ __device__ constexpr int staged_offset(int r) { return (r ^ ((r >> 3) & 3)) * 8; }
constexpr size_t smem_bytes(int64_t D) { return D <= kStagedRows ? size_t((D + 3) / 4 * 4) * 8 * sizeof(float) : 0; }
template <int E> constexpr int chunk_elems() { return 8 * (E + 8); }
template <int E> constexpr int tile_elems() { return kRowsK * (E + 8); }
}  // namespace f16_state_tiles_cfg

__device__ __forceinline__ float state_scale_of(float max_abs) {
  if (!(max_abs > 0.f) || !isfinite(max_abs)) return 1.f;
  int ex = 0;
  frexpf(max_abs, &ex);  // max_abs < 2^ex
  return ldexpf(1.f, max(-126, min(126, f16_state_tiles_cfg::kScaleBits - ex)));
}

template <int E>
__global__ void __launch_bounds__(f16_state_tiles_cfg::kThreads) f16_state_tiles_kernel(f16_state_tiles_params P) {
  using namespace f16_state_tiles_cfg;
  constexpr int kGroups = E / 8 + 1;
  const int group = static_cast<int>(blockIdx.x % kGroups), tid = threadIdx.x;
  const int64_t state = blockIdx.x / kGroups;  // (batch * n + chunk) * h + kv
  const int64_t kv = state % P.h, m = (state / P.h) % P.n, batch = state / (P.h * P.n);
  const bool z_group = group == E / 8;
  // Column c < 8 of the group at row r: src[r * stride + c] (z: column 0 only).
  const float* src = z_group ? (P.z ? P.z + batch * P.z_sb + m * P.z_sn + kv * P.z_sh : nullptr)
                             : P.S + batch * P.S_sb + m * P.S_sn + kv * P.S_sh + group * 8;
  const int64_t stride = z_group ? P.z_sD : P.S_sD;
  extern __shared__ float staged[];  // row r at staged_offset(r), when D <= kStagedRows
  const bool stage = P.D <= kStagedRows;

  // 1. The group's rows into shared memory by cp.async, every copy of the CTA in flight at once, and
  // the columns' largest magnitudes: each thread reads back the pieces it copied (16-byte halves of
  // S rows: columns 4 (tid % 2) .. + 3; z entries: column 0, the other 7 columns zero). States too
  // large to stage are read from global memory instead.
  const int D = static_cast<int>(P.D);
  float mx[4] = {0.f, 0.f, 0.f, 0.f};
  if (stage && !z_group) {
    for (int i = tid; i < 2 * D; i += kThreads)
      copy_async<16>(staged + staged_offset(i / 2) + (i % 2) * 4, src + (i / 2) * stride + (i % 2) * 4, true);
    copy_async_commit();
    copy_async_wait<0>();
    for (int i = tid; i < 2 * D; i += kThreads) {
      const float4 v = *reinterpret_cast<const float4*>(staged + staged_offset(i / 2) + (i % 2) * 4);
      mx[0] = fmaxf(mx[0], fabsf(v.x)); mx[1] = fmaxf(mx[1], fabsf(v.y));
      mx[2] = fmaxf(mx[2], fabsf(v.z)); mx[3] = fmaxf(mx[3], fabsf(v.w));
    }
  } else if (stage) {
    for (int r = tid; r < D; r += kThreads) {
      float* row = staged + staged_offset(r);
      if (src) copy_async<4>(row, src + r * stride, true);
      else row[0] = 0.f;
#pragma unroll
      for (int c = 1; c < 8; ++c) row[c] = 0.f;
    }
    copy_async_commit();
    copy_async_wait<0>();
    for (int r = tid; r < D; r += kThreads) mx[0] = fmaxf(mx[0], fabsf(staged[staged_offset(r)]));
  } else {
    for (int i = tid; i < 2 * D; i += kThreads)
      for (int c = 0; c < 4; ++c)
        if (src && (!z_group || (i % 2 == 0 && c == 0)))
          mx[c] = fmaxf(mx[c], fabsf(src[int64_t(i / 2) * stride + (i % 2) * 4 + c]));
  }
  // Lanes of one parity hold the same 4 columns (z: column 0 of both parities); then over warps.
#pragma unroll
  for (int o = 2; o < 32; o *= 2)
#pragma unroll
    for (int c = 0; c < 4; ++c) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], o));
  if (z_group) mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], 1));
  __shared__ float warp_max[kThreads / 32][8];
  if (tid % 32 < 2)
#pragma unroll
    for (int c = 0; c < 4; ++c) warp_max[tid / 32][(tid % 2) * 4 + c] = mx[c];
  __syncthreads();  // the maxima and every thread's staged pieces
  __shared__ float scale[8];
  if (tid < 8) {
    float v = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) v = fmaxf(v, warp_max[w][tid]);
    scale[tid] = z_group && tid > 0 ? 0.f : state_scale_of(v);  // z's group: zero columns past z
    if (!z_group || tid == 0) P.scales[state * (E + 1) + group * 8 + tid] = scale[tid];
  }
  __syncthreads();

  // 2. Per (block, chunk of 8 K rows, column): one 16-byte piece of 8 rows of f16; consecutive
  // lanes write a core matrix's 8 columns (128 contiguous bytes).
  const int col = tid % 8;
  const float col_scale = scale[col];
  const int pieces = static_cast<int>(P.blocks.count) * kRowsK;  // (block, K chunk, column)
  __half* const out = P.tiles + state * P.blocks.count * tile_elems<E>() + group * 64 + col * 8;
  // The pieces of this thread, with value(r) = its column at row r. The 8 table entries first (64
  // contiguous bytes), then every value, without branches, so that the loads overlap.
  auto write_pieces = [&](auto value) {
    for (int i = tid; i < pieces; i += kThreads) {
      const int blk = i / kRowsK, chunk = i / 8 % 8;
      const uint4* tab = reinterpret_cast<const uint4*>(P.blocks.row + blk * kRowsK + chunk * 8);
      uint4 t[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) t[k] = tab[k];
      const phi_block_row* e = reinterpret_cast<const phi_block_row*>(t);
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float x = value(max(e[k].row, 0));
        v[k] = e[k].row >= 0 ? x * e[k].coef * col_scale : 0.f;  // padding rows: zero
      }
      const uint4 piece = make_uint4(pack2_f32<__half>(v[0], v[1]), pack2_f32<__half>(v[2], v[3]),
                                     pack2_f32<__half>(v[4], v[5]), pack2_f32<__half>(v[6], v[7]));
      *reinterpret_cast<uint4*>(out + blk * tile_elems<E>() + chunk * chunk_elems<E>()) = piece;
    }
  };
  if (stage)
    write_pieces([&](int r) { return staged[staged_offset(r) + col]; });
  else if (src && (!z_group || col == 0))
    write_pieces([&](int r) { return src[int64_t(r) * stride + col]; });
  else
    write_pieces([](int) { return 0.f; });
}

}  // namespace expanse_cuda
