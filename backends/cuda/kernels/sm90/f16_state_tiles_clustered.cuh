// The f16 state tiles of f16_state_tiles.cuh (same tiles, same scales) for the tiled layout with
// d_tile 8, where phi block s is rows 64 s .. 64 s + 63 of the state as they stand (one coefficient
// per block): a cluster of kCluster CTAs per state, each CTA a run of rows.
//
// Why: the column-group pass reads 32 bytes of every 256-byte row per CTA and gathers rows through
// the block table, so its CTAs read scattered sectors and then write, in step with each other
// (measured: DRAM 65% busy, L2 89%, 0.21 ms at P1 against a 0.15 ms floor). Here every CTA copies a
// contiguous run of rows (all columns and z) and writes a contiguous run of tiles; only the column
// maxima cross CTAs, through distributed shared memory. The CTAs are persistent, each cluster takes
// the states in turn, and with two buffers the next state's rows land while this one's tiles are
// written.
//
// Per state: (1) each thread reads back the 16-byte pieces it copied (always the same 4 columns,
// as kThreads is a multiple of the pieces per row) and z entries, for the CTA's column maxima;
// (2) each CTA stores its maxima into its slot in every CTA of the cluster by st.async, which
// completes on the receiver's transaction barrier (a releasing cluster barrier instead made every
// thread wait for its copies of the next state first: measured 0.25 ms); the slots alternate
// between two sets by state, so a CTA one state ahead never overwrites maxima still being read;
// (3) each CTA takes the maximum over the slots, the scales, and writes its tiles: piece i (16
// bytes: 8 K rows of one column) of its run goes to tile byte 16 i.
#pragma once

#include <cuda_fp16.h>

#include "kernels/sm90/cluster.cuh"
#include "kernels/sm90/f16_state_tiles.cuh"

namespace expanse_cuda {

namespace f16_state_tiles_clustered_cfg {
constexpr int kThreads = 512;
constexpr int kCluster = 8;
// The blocks a CTA's rows may touch (the coefficients it keeps).
constexpr int kMaxBlocksPerCta = 32;
// The state's chunks of 8 rows (a tile's K chunks) are shared out evenly, so that no CTA of the
// cluster waits for one with a block more (at P1, 36 blocks: 4.5 each). The rows of the CTA with
// the most chunks (the buffers' size), and the floats of one buffer: those rows of S (E each), then
// their z entries.
__host__ __device__ constexpr int64_t max_rows(int64_t blocks) { return (blocks * 8 + kCluster - 1) / kCluster * 8; }
constexpr size_t buffer_bytes(int64_t blocks, int e) { return size_t(max_rows(blocks)) * (e + 1) * sizeof(float); }
// Statically allocated: per-warp maxima, the two slot sets and their barriers, the scales, the
// blocks' coefficients.
constexpr size_t static_bytes(int e) {
  return size_t(kThreads / 32 + 2 * kCluster + 1) * (e + 1) * sizeof(float) + 16 + kMaxBlocksPerCta * sizeof(float);
}
}  // namespace f16_state_tiles_clustered_cfg

template <int E>
__global__ void __launch_bounds__(f16_state_tiles_clustered_cfg::kThreads, 1)
    f16_state_tiles_clustered_kernel(f16_state_tiles_params P) {
  using namespace f16_state_tiles_clustered_cfg;
  using f16_state_tiles_cfg::kRowsK;
  constexpr int kPieces = E / 4;  // 16-byte pieces of an S row
  constexpr int kCols = E + 8;    // tile columns: S's E, z, 7 zeros
  static_assert(kPieces <= 32 && kThreads % kPieces == 0, "each thread reads back the same 4 columns");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rank = static_cast<int>(cluster_rank());
  const int64_t first = cluster_index(), clusters = cluster_count();
  const int blocks = static_cast<int>(P.blocks.count);
  const int chunk0 = rank * blocks * 8 / kCluster, chunk1 = (rank + 1) * blocks * 8 / kCluster;
  const int rows = (chunk1 - chunk0) * 8, row0 = chunk0 * 8, blk0 = chunk0 / 8;
  const int buf_rows = static_cast<int>(max_rows(blocks));
  const int64_t buffer_elems = int64_t(buf_rows) * (E + 1);
  extern __shared__ __align__(16) float staged[];  // P.buffers x [buf_rows][E], then [buf_rows] z
  __shared__ float warp_max[kThreads / 32][E + 1];
  __shared__ float slots[2][kCluster][E + 1];  // [state parity][rank][column]
  __shared__ __align__(8) uint64_t slots_full[2];  // per slot set: all kCluster (E + 1) maxima have landed
  __shared__ float scale[E + 1];
  __shared__ float block_coef[kMaxBlocksPerCta];  // of the blocks from blk0 on (one per block in tiled:8)
  constexpr uint32_t kSlotBytes = kCluster * (E + 1) * sizeof(float);

  // Starts the copies of this CTA's rows of `state` into `buf` (z entries: zeros without z).
  auto load = [&](int64_t state, float* buf) {
    const int64_t kv = state % P.h, m = (state / P.h) % P.n, batch = state / (P.h * P.n);
    const float* const s = P.S + batch * P.S_sb + m * P.S_sn + kv * P.S_sh + row0 * P.S_sD;
    for (int i = tid; i < rows * kPieces; i += kThreads)
      copy_async<16>(buf + i * 4, s + (i / kPieces) * P.S_sD + (i % kPieces) * 4, true);
    const float* const z = P.z ? P.z + batch * P.z_sb + m * P.z_sn + kv * P.z_sh + row0 * P.z_sD : P.S;
    for (int r = tid; r < rows; r += kThreads) copy_async<4>(buf + buf_rows * E + r, z + r * P.z_sD, P.z != nullptr);
    copy_async_commit();
  };

  if (tid == 0) {
    mbarrier_init(&slots_full[0], 1);
    mbarrier_init(&slots_full[1], 1);
    mbarrier_init_fence();
  }
  for (int b = tid; blk0 + b <= (chunk1 - 1) / 8; b += kThreads) block_coef[b] = P.blocks.row[(blk0 + b) * kRowsK].coef;
  cluster_sync();  // every CTA's barriers are ready before any maxima arrive
  if (first < P.states) load(first, staged);
  for (int64_t item = 0, state = first; state < P.states; ++item, state += clusters) {
    const int parity = static_cast<int>(item & 1);
    const float* const buf = staged + (P.buffers == 2 ? parity : 0) * buffer_elems;
    const float* const zs = buf + buf_rows * E;
    const bool next = state + clusters < P.states;
    if (P.buffers == 2 && next) {  // the other buffer was last read before the previous state's end
      load(state + clusters, staged + (parity ^ 1) * buffer_elems);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    // The maxima of this slot set may land from here on (a peer can be ahead, never by two states:
    // it needs this CTA's maxima of the state in between).
    if (tid == 0) mbarrier_arrive_expect_tx(&slots_full[parity], kSlotBytes);

    // 1. This CTA's column maxima.
    float mx[4] = {0.f, 0.f, 0.f, 0.f}, mz = 0.f;
    for (int i = tid; i < rows * kPieces; i += kThreads) {
      const float4 v = reinterpret_cast<const float4*>(buf)[i];
      mx[0] = fmaxf(mx[0], fabsf(v.x)); mx[1] = fmaxf(mx[1], fabsf(v.y));
      mx[2] = fmaxf(mx[2], fabsf(v.z)); mx[3] = fmaxf(mx[3], fabsf(v.w));
    }
    for (int r = tid; r < rows; r += kThreads) mz = fmaxf(mz, fabsf(zs[r]));
#pragma unroll
    for (int o = kPieces; o < 32; o *= 2)
#pragma unroll
      for (int c = 0; c < 4; ++c) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], o));
#pragma unroll
    for (int o = 1; o < 32; o *= 2) mz = fmaxf(mz, __shfl_xor_sync(0xffffffffu, mz, o));
    if (lane < kPieces)
#pragma unroll
      for (int c = 0; c < 4; ++c) warp_max[warp][lane * 4 + c] = mx[c];
    if (lane == 0) warp_max[warp][E] = mz;
    __syncthreads();  // the warps' maxima, and every thread's copies of the rows

    // 2. Into this rank's slot of every CTA of the cluster; once all ranks' have landed here, the
    // scales (the same in every CTA).
    if (tid <= E) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) v = fmaxf(v, warp_max[w][tid]);
      for (int q = 0; q < kCluster; ++q) store_remote_async(&slots[parity][rank][tid], q, v, &slots_full[parity]);
      mbarrier_wait(&slots_full[parity], static_cast<uint32_t>(item >> 1) & 1);
#pragma unroll
      for (int q = 0; q < kCluster; ++q) v = fmaxf(v, slots[parity][q][tid]);
      scale[tid] = state_scale_of(v);
      if (rank == 0) P.scales[state * (E + 1) + tid] = scale[tid];
    }
    __syncthreads();

    // 3. This CTA's tiles. Consecutive threads: consecutive columns of one chunk of 8 rows
    // (conflict-free reads, E words per row) and consecutive 16-byte pieces of the tiles.
    constexpr int kTileElems = f16_state_tiles_cfg::tile_elems<E>();
    uint4* const out = reinterpret_cast<uint4*>(P.tiles + state * blocks * kTileElems +
                                                int64_t(chunk0) * f16_state_tiles_cfg::chunk_elems<E>());
    for (int i = tid; i < rows / 8 * kCols; i += kThreads) {
      const int chunk = i / kCols, col = i % kCols;
      const float* const x = col < E ? buf + chunk * 8 * E + col : zs + chunk * 8;
      const int step = col < E ? E : 1;
      const float f = block_coef[(chunk0 + chunk) / 8 - blk0] * scale[min(col, E)];
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = col <= E ? x[k * step] * f : 0.f;
      out[i] = make_uint4(pack2_f32<__half>(v[0], v[1]), pack2_f32<__half>(v[2], v[3]), pack2_f32<__half>(v[4], v[5]),
                          pack2_f32<__half>(v[6], v[7]));
    }
    __syncthreads();  // the buffer, the maxima and the scales are free again
    if (P.buffers == 1 && next) load(state + clusters, staged);
  }
}

}  // namespace expanse_cuda
