// The state terms of dq and dk (kernels/sm80/mma_state_pullback.cuh) with the tile product on
// Hopper's warpgroup tensor cores (wgmma, sm_90a): u = x (hi + lo)^T for a warpgroup's 64 tokens is
// 2 E / 16 m64n64k16 products, x from registers (the mma.sync A fragments), the tile from shared
// memory, read once per warpgroup where mma.sync reads it once per warp: the ldmatrix traffic that
// bounded the sm_80 kernel drops 4x.
#pragma once

#include "kernels/sm80/mma_state_pullback.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

// A tile as wgmma's K-major core matrices (8 tile rows x 8 columns, 128 contiguous bytes): the 8
// core matrices of 8 columns side by side along the rows, then 16 bytes of padding, so that the k
// blocks start 16 bytes apart in the banks (a warp's stores span 2 rows and all E columns).
template <class T, int E>
struct wgmma_pullback_tiles {
  using type = T;
  static constexpr int kKStride = 64 * 8 + 8;  // elements from one 8-column block to the next
  static constexpr int kElems = E / 8 * kKStride;
  __device__ static int offset(int tr, int col) { return (col / 8) * kKStride + (tr / 8) * 64 + (tr % 8) * 8 + col % 8; }
  // The row and first column of the tile's 8-element run c (offset 8 c); false: padding.
  __device__ static bool run_at(int c, int& tr, int& col) {
    tr = c % (kKStride / 8), col = c / (kKStride / 8) * 8;
    return tr < 64;
  }
  // The tile's copies become visible to the tensor cores after the barrier.
  __device__ static void before_barrier() { fence_async_shared(); }
  // Issues the products; product_finish waits for them (the kernel splits the next tile between).
  __device__ static void product_start(float (&u)[8][4], const uint32_t (&xa)[E / 16][4], const T* hi, const T* lo, int) {
    float(&d)[32] = reinterpret_cast<float(&)[32]>(u);
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    wgmma_pin(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < E / 16; ++kk) wgmma_rs<T, 64>(d, xa[kk], kmajor_desc(hi + kk * 2 * kKStride, kKStride * sizeof(T), 128));
#pragma unroll
    for (int kk = 0; kk < E / 16; ++kk) wgmma_rs<T, 64>(d, xa[kk], kmajor_desc(lo + kk * 2 * kKStride, kKStride * sizeof(T), 128));
    wgmma_commit();
  }
  __device__ static void product_finish(float (&u)[8][4]) {
    float(&d)[32] = reinterpret_cast<float(&)[32]>(u);
    wgmma_wait<0>();
    wgmma_pin(d);
  }
};

}  // namespace expanse_cuda
