// The flash kernel of chunk_attention (kernels/sm80/flash_chunk_attention.cuh) with its two products
// on wgmma (sm_90a), for d = e = 64: S = Q K^T with this warpgroup's query fragments in registers and
// the key block as a K-major B in shared memory, and O += P V with P's fragments in registers and the
// value block as an N-major B. The terms between them (scores in log space, masks, row maxima, the
// rescale) are the mma.sync kernel's own (flash_block_terms): wgmma's m64 accumulators have mma.sync's
// layout per warp (warp w: rows 16 w + g and + 8).
//
// Why: the mma.sync kernel holds 252 registers (two CTAs per SM) and each warp reads every key and
// value block through ldmatrix; capped at 168 registers it spilled and ran slower (docs/performance.md).
// Here B is read once per block by the tensor cores, the products are 8 instructions per block where
// they were 64 mma.sync and their fragment loads, and the CTA fits in 168 registers (167; 148 for
// the denominators): three CTAs per SM. H100, P1: the kernel 213 -> 178 us at t = 4096 (one chunk)
// and 727 -> 565 us at 65536 (c = 1024); the denominators 146 and 460 -> 436 us. The tensor pipe is
// still mostly idle: each block's chain (products, terms, products) runs serially in its warpgroup.
//
// Key and value blocks (64 rows of 128 bytes, the hardware's 128-byte swizzle: one layout serves as
// K-major B for the keys and N-major B for the values) arrive by cp.async, double-buffered: block
// blk + 1 is copied while blk is multiplied. kValues = false: l and rowmax alone (the backward's
// denominators).
#pragma once

#include "kernels/sm80/flash_chunk_attention.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

namespace wgmma_flash_cfg {
constexpr int kDim = 64;                           // d = e
constexpr int kRowBytes = kDim * 2;                // one swizzled row: 128 bytes
constexpr int kBlockBytes = flash_cfg::kKeys * kRowBytes;  // 8 KB per key or value block
}  // namespace wgmma_flash_cfg

template <class T, bool kValues>
constexpr size_t wgmma_flash_smem() {
  using namespace wgmma_flash_cfg;
  return 1024 /* alignment */ + (kValues ? 4 : 2) * size_t(kBlockBytes) +
         size_t(flash_cfg::kRows) * (kDim + 8) * sizeof(T) + 2 * flash_cfg::kKeys * sizeof(float) +
         flash_cfg::kRows * (sizeof(float) + sizeof(int));
}

template <class T, bool kValues>
__global__ void __launch_bounds__(flash_cfg::kThreads, 3) wgmma_flash_chunk_attention_kernel(flash_params P) {
  using namespace flash_cfg;
  using namespace wgmma_flash_cfg;
  constexpr int DH = kDim, kQS = DH + 8, kNT = kValues ? kDim / 8 : 1;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // The swizzled blocks need 1024-byte alignment.
  unsigned char* const kb = static_cast<unsigned char*>(
      __builtin_assume_aligned(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024), 1024));  // [2] key blocks
  unsigned char* const vb = kb + 2 * kBlockBytes;                               // [2] value blocks (kValues)
  T* const qs = reinterpret_cast<T*>(vb + (kValues ? 2 * kBlockBytes : 0));     // [kRows][kQS]
  float* const gk = reinterpret_cast<float*>(qs + kRows * kQS);                 // [2][kKeys]: keys' restarted Gc, base 2
  float* const gq = gk + 2 * kKeys;                                             // [kRows]
  int* const fk = reinterpret_cast<int*>(gq + kRows);                           // [kRows]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const cta_coords at = decode_cta(P.q_tiles, P.hq, P.n);
  const int64_t qh = at.head, m = at.chunk, batch = at.batch;
  const int64_t kv = qh / (P.hq / P.h), bh = batch * P.h + kv;
  const int64_t first = m * P.c, len = min(P.c, P.t - first);
  const int q0 = at.tile * kRows;  // local index of the first query row
  if (q0 >= len) return;

  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + kv * P.k_sh;
  const T* vbase = static_cast<const T*>(P.v) + batch * P.v_sb + kv * P.v_sh;
  // Block `key0` into buffer `buf`: 16-byte chunk c of row s at its swizzled place (zeros past the
  // chunk, whose sources are not read), and the keys' gates.
  auto issue_block = [&](int key0, int buf) {
#pragma unroll
    for (int i = 0; i < kKeys * 8 / kThreads; ++i) {
      const int vi = tid + i * kThreads, s = vi / 8, c = vi % 8;
      const bool in = key0 + s < len;
      const uint32_t dst = buf * kBlockBytes + swizzled_row_offset(s, c, kRowBytes);
      copy_async<16>(kb + dst, in ? kbase + (first + key0 + s) * P.k_st + c * 8 : kbase, in);
      if constexpr (kValues) copy_async<16>(vb + dst, in ? vbase + (first + key0 + s) * P.v_st + c * 8 : vbase, in);
    }
    copy_async_commit();
    if (tid < kKeys) gk[buf * kKeys + tid] = key0 + tid < len ? P.g.since_reset(bh, P.t, first + key0 + tid) * kLog2e : 0.f;
  };

  const int last_key = static_cast<int>(min(len, int64_t(q0 + kRows)));  // keys [0, last_key) matter
  const int blocks = (last_key + kKeys - 1) / kKeys;
  issue_block(0, 0);
  flash_load_queries<T, DH>(P, static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh, first, len, q0, bh, tid, qs,
                            gq, fk);
  __syncthreads();

  const flash_rows rows = warp_rows(q0, warp, g, gq, fk);

  // B of k16 slice kk in buffer b: the keys' descriptor plus b kBufDesc plus kk x 32 bytes (within
  // the 128-byte rows), the values' plus b kBufDesc plus kk x 16 rows.
  const uint64_t kdesc0 = kmajor_swizzled_desc(kb), vdesc0 = nmajor_swizzled_desc(vb, kRowBytes, kBlockBytes, 8 * kRowBytes);
  constexpr uint32_t kBufDesc = kBlockBytes / 16, kKeySliceDesc = 32 / 16, kValueSliceDesc = 16 * kRowBytes / 16;

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
  if constexpr (kValues) wgmma_pin(reinterpret_cast<float(&)[32]>(acc));  // the zeros stay ahead of the products (C7515)
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};

  for (int blk = 0; blk < blocks; ++blk) {
    const int buf = blk & 1, key0 = blk * kKeys;
    // Block blk has landed (for the tensor cores too), and every product of block blk - 1, whose
    // buffer the next copies take, is complete.
    copy_async_wait<0>();
    wgmma_wait<0>();
    fence_async_shared();
    __syncthreads();
    if (blk + 1 < blocks) issue_block(key0 + kKeys, buf ^ 1);

    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
    wgmma_pin(reinterpret_cast<float(&)[32]>(s));
    // This warp's 16 query rows as A fragments, for every k16 slice of d, loaded for each block:
    // loaded once before the loop, the compiler (CUDA 13.0) gave their registers to P's fragments
    // of the values kernel, and every block after the first multiplied P by the keys.
    uint32_t qa[DH / 16][4];
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk)
      ldmatrix_x4(qa[kk], qs + (warp * 16 + (lane & 15)) * kQS + kk * 16 + (lane >> 4) * 8);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk) wgmma_rs<T, 64>(&s[0][0], qa[kk], kdesc0 + buf * kBufDesc + kk * kKeySliceDesc);
    wgmma_commit();
    wgmma_wait<0>();  // also the previous block's P V: acc may be rescaled
    wgmma_pin(reinterpret_cast<float(&)[32]>(s));
    if constexpr (kValues) wgmma_pin(reinterpret_cast<float(&)[32]>(acc));

    uint32_t pa[4][4];
    flash_block_terms<T, kValues>(P, rows, gk + buf * kKeys, key0, len, g, tq, s, mrow, lrow, acc, pa);
    if constexpr (kValues) {
      wgmma_pin(reinterpret_cast<float(&)[32]>(acc));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs<T, 64, true>(&acc[0][0], pa[kk], vdesc0 + buf * kBufDesc + kk * kValueSliceDesc);
      wgmma_commit();
    }
  }
  wgmma_wait<0>();
  if constexpr (kValues) wgmma_pin(reinterpret_cast<float(&)[32]>(acc));
  flash_store_rows<kValues>(P, rows, batch, qh, first, len, tq, mrow, lrow, acc);
}

}  // namespace expanse_cuda
