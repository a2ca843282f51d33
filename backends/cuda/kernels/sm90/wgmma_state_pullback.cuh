// The state terms of dq and dk (kernels/sm80/mma_state_pullback.cuh) with the tile product on
// Hopper's warpgroup tensor cores (wgmma, sm_90a): u = x (hi + lo)^T for a warpgroup's 64 tokens is
// 2 x 2 E / 16 m64n32k16 products (the tile's two halves of rows, a commit group each), x from
// registers (the mma.sync A fragments), the tile from shared memory, read once per warpgroup where
// mma.sync reads it once per warp: the ldmatrix traffic that bounded the sm_80 kernel drops 4x.
#pragma once

#include "kernels/sm80/mma_state_pullback.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

// A tile as wgmma's K-major core matrices (8 tile rows x 8 columns, 128 contiguous bytes): the 8
// core matrices of 8 columns side by side along the rows, then 16 bytes of padding (which kept a
// warp's stores across 2 rows and all E columns apart in the banks when the kernel split its own
// tiles; the copied images keep the layout, and the tiles query reads them N-major).
template <class T, int E>
struct wgmma_pullback_tiles {
  using type = T;
  static constexpr int kKStride = 64 * 8 + 8;  // elements from one 8-column block to the next
  static constexpr int kElems = E / 8 * kKStride;
  static constexpr bool kLoadsAhead = true;  // state_pullback_kernel's prologue and epilogue: see there
  __device__ static int offset(int tr, int col) { return (col / 8) * kKStride + (tr / 8) * 64 + (tr % 8) * 8 + col % 8; }
  // The row and first column of the tile's 8-element run c (offset 8 c); false: padding.
  __device__ static bool run_at(int c, int& tr, int& col) {
    tr = c % (kKStride / 8), col = c / (kKStride / 8) * 8;
    return tr < 64;
  }
  // The tile's copies become visible to the tensor cores after the barrier.
  __device__ static void before_barrier() { fence_async_shared(); }
  // Issues the products in two groups, the tile's rows 0-31 (u[0..3]) and 32-63 (u[4..7]), so that
  // the epilogue of the first half runs while the tensor cores multiply the second; product_wait
  // waits for one half.
  __device__ static void product_start(float (&u)[8][4], const uint32_t (&xa)[E / 16][4], const T* hi, const T* lo, int) {
    // K slice kk starts 2 kk 8-column blocks in, half h 4 h 8-row groups in: the descriptor is the
    // tile's plus those offsets (in the address field's 16-byte units).
    const uint64_t hi_desc = kmajor_desc(hi, kKStride * sizeof(T), 128), lo_desc = kmajor_desc(lo, kKStride * sizeof(T), 128);
    const auto offset_desc = [](int kk, int h) { return uint64_t((kk * 2 * kKStride + h * 32 * 8) * sizeof(T) / 16); };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float(&d)[16] = reinterpret_cast<float(&)[16]>(u[4 * h]);
#pragma unroll
      for (int i = 0; i < 16; ++i) d[i] = 0.f;
      wgmma_pin(d);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < E / 16; ++kk) wgmma_rs<T, 32>(d, xa[kk], hi_desc + offset_desc(kk, h));
#pragma unroll
      for (int kk = 0; kk < E / 16; ++kk) wgmma_rs<T, 32>(d, xa[kk], lo_desc + offset_desc(kk, h));
      wgmma_commit();
    }
  }
  // Half h (a compile-time value after unrolling) of u is complete.
  __device__ static void product_wait(float (&u)[8][4], int h) {
    float(&d)[16] = reinterpret_cast<float(&)[16]>(u[4 * h]);
    if (h == 0) wgmma_wait<1>();
    else wgmma_wait<0>();
    wgmma_pin(d);
  }
};

}  // namespace expanse_cuda
