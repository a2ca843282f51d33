// The flash kernel of chunk_attention (kernels/sm80/flash_chunk_attention.cuh) with its two products
// on wgmma (sm_90a), for d = e = 64: S = Q K^T with the query block (A) and the key block (B) both
// K-major in shared memory, and O += P V with P's fragments in registers and the value block as an
// N-major B. The terms between them (scores in log space, masks, row maxima, the rescale) are the
// mma.sync kernel's own (flash_block_weights, flash_rescale_pack): wgmma's m64 accumulators have
// mma.sync's layout per warp (warp w: rows 16 w + g and + 8).
//
// Why: the mma.sync kernel holds 252 registers (two CTAs per SM) and each warp reads every key and
// value block through ldmatrix; capped at 168 registers it spilled and ran slower (docs/performance.md).
// Here the operands are read once per block by the tensor cores, the products are 8 instructions per
// block, and the CTA takes 158 registers (118 for the denominators): three CTAs per SM. H100, P1, the
// kernel at t = 4096 (one chunk): 213 us (mma.sync) -> 178 (wgmma) -> 112-124 (the copies' addresses
// formed once, the gates by cp.async, the score terms without range fixups, the longest tiles first;
// docs/performance.md lesson 17). The tensor pipe is still mostly idle (24%): each block's chain
// (products, terms, products) runs serially in its warpgroup.
//
// Key and value blocks (64 rows of 128 bytes, the hardware's 128-byte swizzle: one layout serves as
// K-major B for the keys and N-major B for the values) arrive by cp.async into kStages buffers, block
// blk + 1 while blk is multiplied. kValues = false: l and rowmax alone (the backward's denominators).
#pragma once

#include "kernels/sm80/flash_chunk_attention.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

namespace wgmma_flash_cfg {
constexpr int kDim = 64;                           // d = e
constexpr int kRowBytes = kDim * 2;                // one swizzled row: 128 bytes
constexpr int kBlockBytes = flash_cfg::kKeys * kRowBytes;  // 8 KB per key or value block
// Buffers of key (and value) blocks: with values, block blk + 1 arrives while blk is multiplied
// and P V of blk - 1 still reads its values.
template <bool kValues>
constexpr int stages_for = kValues ? 3 : 2;
}  // namespace wgmma_flash_cfg

template <class T, bool kValues>
constexpr size_t wgmma_flash_smem() {
  using namespace wgmma_flash_cfg;
  return 1024 /* alignment */ + ((kValues ? 2 : 1) * stages_for<kValues> + 1 /* queries */) * size_t(kBlockBytes) +
         stages_for<kValues> * flash_cfg::kKeys * sizeof(float) +
         flash_cfg::kRows * (sizeof(float) + sizeof(int));
}

template <class T, bool kValues>
__global__ void __launch_bounds__(flash_cfg::kThreads, 3) wgmma_flash_chunk_attention_kernel(flash_params P) {
  using namespace flash_cfg;
  using namespace wgmma_flash_cfg;
  constexpr int DH = kDim, kNT = kValues ? kDim / 8 : 1, kStages = stages_for<kValues>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // The swizzled blocks need 1024-byte alignment.
  unsigned char* const kb = static_cast<unsigned char*>(
      __builtin_assume_aligned(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024), 1024));  // [kStages] key blocks
  unsigned char* const vb = kb + kStages * kBlockBytes;                         // [kStages] value blocks (kValues)
  T* const qs = reinterpret_cast<T*>(vb + (kValues ? kStages * kBlockBytes : 0));  // the query block, swizzled
  float* const gk = reinterpret_cast<float*>(qs + kRows * DH);                  // [kStages][kKeys]: keys' restarted Gc
  float* const gq = gk + kStages * kKeys;                                       // [kRows]
  int* const fk = reinterpret_cast<int*>(gq + kRows);                           // [kRows]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const cta_coords at = flash_cta(P);
  const int64_t qh = at.head, m = at.chunk, batch = at.batch;
  const int64_t kv = qh / (P.hq / P.h), bh = batch * P.h + kv;
  const int64_t first = m * P.c, len = min(P.c, P.t - first);
  const int q0 = at.tile * kRows;  // local index of the first query row
  if (q0 >= len) return;

  // Block `key0` into buffer `buf`: this thread copies 16-byte chunk tid % 8 of rows tid / 8 + 16 i
  // to their swizzled places (the same for every block, 2048 bytes apart; zeros past the chunk,
  // whose sources are not read), and the keys' gates, copied likewise: read by a plain load and
  // stored, they held the block's chain on a global load's latency. The sources are formed once and
  // stepped: per copy from its indices they were a fifth of the kernel's instructions.
  constexpr int kCopies = kKeys * 8 / kThreads, kCopyRows = kThreads / 8;
  const int copy_row = tid / 8;
  const uint32_t copy_dst = swizzled_row_offset(copy_row, tid % 8, kRowBytes);
  const T* const kbase = static_cast<const T*>(P.k) + batch * P.k_sb + kv * P.k_sh;
  const T* const vbase = static_cast<const T*>(P.v) + batch * P.v_sb + kv * P.v_sh;
  const T* const ksrc = kbase + (first + copy_row) * P.k_st + (tid % 8) * 8;
  const T* const vsrc = vbase + (first + copy_row) * P.v_st + (tid % 8) * 8;
  auto issue_block = [&](int key0, int buf) {
    const T* k_at = ksrc + key0 * P.k_st;
    const T* v_at = vsrc + key0 * P.v_st;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool in = key0 + copy_row + i * kCopyRows < len;
      const uint32_t dst = buf * kBlockBytes + copy_dst + i * kCopyRows * kRowBytes;
      copy_async<16>(kb + dst, in ? k_at : kbase, in);
      if constexpr (kValues) copy_async<16>(vb + dst, in ? v_at : vbase, in);
      k_at += kCopyRows * P.k_st, v_at += kCopyRows * P.v_st;
    }
    if (tid < kKeys) {
      const float* gate = P.g.since_reset_at(bh, P.t, first + key0 + tid);
      const bool in = gate && key0 + tid < len;
      copy_async<4>(gk + buf * kKeys + tid, in ? static_cast<const void*>(gate) : kbase, in);
    }
    copy_async_commit();
  };

  const int last_key = static_cast<int>(min(len, int64_t(q0 + kRows)));  // keys [0, last_key) matter
  const int blocks = (last_key + kKeys - 1) / kKeys;
  issue_block(0, 0);
  flash_load_queries<T, DH, true>(P, static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh, first, len, q0, bh,
                                  tid, qs, gq, fk);
  __syncthreads();

  const flash_rows rows = warp_rows(q0, warp, g, gq, fk);

  // Operands of k16 slice kk in buffer b: the queries' descriptor plus kk x 32 bytes (within the
  // 128-byte rows), the keys' plus b kBufDesc plus the same, the values' plus b kBufDesc plus kk x 16
  // rows.
  const uint64_t qdesc0 = kmajor_swizzled_desc(qs), kdesc0 = kmajor_swizzled_desc(kb),
                 vdesc0 = nmajor_swizzled_desc(vb, kRowBytes, kBlockBytes, 8 * kRowBytes);
  constexpr uint32_t kBufDesc = kBlockBytes / 16, kKeySliceDesc = 32 / 16, kValueSliceDesc = 16 * kRowBytes / 16;

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
  if constexpr (kValues) wgmma_pin(reinterpret_cast<float(&)[32]>(acc));  // the zeros stay ahead of the products (C7515)
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  uint32_t pa[4][4];  // P of the block, the A of its P V (kValues)

  for (int blk = 0; blk < blocks; ++blk) {
    const int buf = blk % kStages, key0 = blk * kKeys;
    // Block blk has landed (for the tensor cores too). The copies of block blk + 1 take the buffer
    // of block blk + 1 - kStages, whose products are complete (waited for in the block before);
    // with values the third buffer lets the previous block's P V run on through this barrier and
    // the copies (with two, and a wait for it here, the kernel took the same time within the
    // spread of runs: 115-123 against 112-124 us at P1 t = 4096).
    copy_async_wait<0>();
    fence_async_shared();
    __syncthreads();
    if (blk + 1 < blocks) issue_block(key0 + kKeys, (blk + 1) % kStages);

    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
    wgmma_pin(reinterpret_cast<float(&)[32]>(s));
    // Q from shared memory: as register fragments, loaded once before the loop, the compiler (CUDA
    // 13.0) gave their registers to P's fragments (every block after the first multiplied P by the
    // keys, even with the fragments pinned after each wait); loaded for each block, the loads
    // defined a wgmma's inputs while the previous block's P V ran, and ptxas serialized every wgmma
    // (C7513).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk)
      wgmma_ss<T, 64>(&s[0][0], qdesc0 + kk * kKeySliceDesc, kdesc0 + buf * kBufDesc + kk * kKeySliceDesc);
    wgmma_commit();
    wgmma_wait<0>();  // S, and the previous block's P V: acc may be rescaled
    wgmma_pin(reinterpret_cast<float(&)[32]>(s));
    if constexpr (kValues) {
      wgmma_pin(reinterpret_cast<float(&)[32]>(acc));
      wgmma_pin_fragments(pa);
    }

    float alpha[2];
    flash_block_weights(P, rows, gk + buf * kKeys, key0, len, g, tq, s, mrow, lrow, alpha);
    if constexpr (kValues) {
      flash_rescale_pack<T>(alpha, s, acc, pa);
      wgmma_pin(reinterpret_cast<float(&)[32]>(acc));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs<T, 64, true>(&acc[0][0], pa[kk], vdesc0 + buf * kBufDesc + kk * kValueSliceDesc);
      wgmma_commit();
    }
  }
  wgmma_wait<0>();
  if constexpr (kValues) {
    wgmma_pin(reinterpret_cast<float(&)[32]>(acc));
    wgmma_pin_fragments(pa);
  }
  flash_store_rows<kValues>(P, rows, batch, qh, first, len, tq, mrow, lrow, acc);
}

}  // namespace expanse_cuda
