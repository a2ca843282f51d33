// The state side of the blocked query kernels (blocked_query_state.cuh, f16_query_state.cuh): per K
// step, the 64 state rows of one phi block and their z entries, gathered by the block's table
// entries (kernels/common.cuh: phi_block_row) into shared memory by cp.async, then converted into
// the step's B tile of wgmma core matrices with the rows' coefficients folded in.
//
// Two rings, each running ahead of the step being multiplied:
// - table stages: the 64 (row, coef) entries of a block, issued 2 R - 1 steps ahead so that they
//   have landed when the block's rows are issued; they live until the block is converted.
// - raw stages (R of them): the block's rows as f32, [64][E] with 16-byte chunk c of row r at
//   c ^ ((r / 2) % chunks) (conflict-free reads of row pairs), then z [64].
// The threads [0, kThreads) of the CTA take part; t is the thread's index among them.
#pragma once

#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

namespace state_block_cfg {
constexpr int kRowsK = 64;  // rows of a phi block: one K step
constexpr int kTableStages = 8;
template <int E>
constexpr size_t raw_stage_bytes() { return size_t(kRowsK) * (E + 1) * sizeof(float); }
constexpr size_t table_stage_bytes() { return size_t(kRowsK) * sizeof(phi_block_row); }
template <int R>
constexpr size_t bytes(int e) { return R * size_t(kRowsK) * (e + 1) * sizeof(float) + kTableStages * table_stage_bytes(); }
}  // namespace state_block_cfg

template <int E, int kThreads, int R>
struct state_block_stages {
  static constexpr int kRowsK = state_block_cfg::kRowsK;
  static constexpr int kRowChunks = E / 4;  // 16-byte chunks per state row
  static constexpr int kRawStages = R;
  static constexpr int kTableAhead = 2 * R - 1;
  static constexpr int kRawBytes = int(state_block_cfg::raw_stage_bytes<E>());
  static_assert(kTableAhead + 1 <= state_block_cfg::kTableStages, "table ring");
  static constexpr int kCopies = kRowsK * kRowChunks / kThreads;  // 16-byte copies per thread and block
  static_assert(kCopies * kThreads == kRowsK * kRowChunks, "whole copies per thread");
  static constexpr int kRowPairs = kRowsK / 2;
  static constexpr int kItems = kRowPairs * E / 4 / kThreads;  // (row pair, 4 columns) per thread
  static_assert(kItems * kThreads == kRowPairs * E / 4, "whole items per thread");

  unsigned char* raw0;        // R raw stages, then the table stages
  const phi_block_row* rows;  // the blocks' table entries in global memory, 64 per block
  const float* S;             // this CTA's state rows (stride S_sD) and z entries (stride z_sD, or null)
  const float* z;
  int64_t S_sD, z_sD, steps;

  __device__ static int swz(int r, int c) { return c ^ ((r >> 1) & (kRowChunks - 1)); }
  __device__ phi_block_row* table_stage(int64_t blk) const {
    return reinterpret_cast<phi_block_row*>(raw0 + R * kRawBytes) + (blk % state_block_cfg::kTableStages) * kRowsK;
  }
  __device__ unsigned char* raw_stage(int64_t blk) const { return raw0 + (blk % R) * kRawBytes; }

  // The table entries of block blk: 512 bytes, 16 per thread of the first 32.
  __device__ void issue_table(int64_t blk, int t) const {
    if (blk < steps && t < kRowsK * int(sizeof(phi_block_row)) / 16)
      copy_async<16>(table_stage(blk) + 2 * t, rows + blk * kRowsK + 2 * t, true);
  }
  // The state rows and z entries of block blk (zeros for padding rows), by its landed table stage.
  __device__ void issue_rows(int64_t blk, int t) const {
    if (blk >= steps) return;
    const phi_block_row* tab = table_stage(blk);
    unsigned char* raw = raw_stage(blk);
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int i = t + j * kThreads, r = i / kRowChunks, c = i % kRowChunks;
      const int32_t row = tab[r].row;
      copy_async<16>(raw + (r * kRowChunks + swz(r, c)) * 16, row >= 0 ? S + int64_t(row) * S_sD + c * 4 : S, row >= 0);
    }
    for (int r = t; r < kRowsK; r += kThreads) {
      const int32_t row = tab[r].row;
      const bool in = z != nullptr && row >= 0;
      copy_async<4>(raw + kRowsK * E * 4 + r * 4, in ? z + int64_t(row) * z_sD : nullptr, in);
    }
  }
  // The column of entry j of this thread's item i (the same for every block; the z entries are
  // item kItems).
  __device__ static int item_col(int t, int i, int j) { return i < kItems ? (t + i * kThreads) / kRowPairs * 4 + j : E; }
  // The raw stage of block blk -> B tile words bw (wgmma core matrices of chunk_elems words / 2 per
  // 8 rows, as wgmma_query_state.cuh): emit(word, x0, x1, i, j) stores the column item_col(t, i, j)
  // of the row pair (x = state entry times the row's coefficient) at word (and past it, for split
  // forms); i and j are compile-time after unrolling. Row pair rp lies in chunk rp / 4 at word rp % 4
  // of each core-matrix row.
  template <int kChunkWords, class Emit>
  __device__ void convert(int64_t blk, uint32_t* bw, int t, Emit emit) const {
    const unsigned char* raw = raw_stage(blk);
    const phi_block_row* tab = table_stage(blk);
    // Batches of up to 4 items: all of a batch's reads first, then its products and stores (the
    // compiler cannot move a shared-memory read above a shared-memory store); 4 bound the registers.
    constexpr int kBatch = kItems < 4 ? kItems : 4;
    static_assert(kItems % kBatch == 0, "whole batches");
#pragma unroll
    for (int i0 = 0; i0 < kItems; i0 += kBatch) {
      float4 s0[kBatch], s1[kBatch];
      float k0[kBatch], k1[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int item = t + (i0 + i) * kThreads, rp = item % kRowPairs, c4 = item / kRowPairs;
        s0[i] = *reinterpret_cast<const float4*>(raw + ((2 * rp) * kRowChunks + swz(2 * rp, c4)) * 16);
        s1[i] = *reinterpret_cast<const float4*>(raw + ((2 * rp + 1) * kRowChunks + swz(2 * rp + 1, c4)) * 16);
        k0[i] = tab[2 * rp].coef;
        k1[i] = tab[2 * rp + 1].coef;
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int item = t + (i0 + i) * kThreads, rp = item % kRowPairs, c4 = item / kRowPairs;
        const float* v0 = reinterpret_cast<const float*>(&s0[i]);
        const float* v1 = reinterpret_cast<const float*>(&s1[i]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = c4 * 4 + j;
          emit(bw + (rp / 4) * kChunkWords + (col / 8) * 32 + (col % 8) * 4 + rp % 4, v0[j] * k0[i], v1[j] * k1[i], i0 + i, j);
        }
      }
    }
    for (int rp = t; rp < kRowPairs; rp += kThreads) {  // the z entries
      const float* zs = reinterpret_cast<const float*>(raw + kRowsK * E * 4);
      emit(bw + (rp / 4) * kChunkWords + (E / 8) * 32 + rp % 4, zs[2 * rp] * tab[2 * rp].coef,
           zs[2 * rp + 1] * tab[2 * rp + 1].coef, kItems, 0);
    }
  }
};

}  // namespace expanse_cuda
