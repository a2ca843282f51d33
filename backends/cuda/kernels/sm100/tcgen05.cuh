// Blackwell's fifth-generation tensor cores (tcgen05, sm_100a): products whose accumulator lives in
// tensor memory (TMEM), issued by one thread, with both operands in shared memory through
// descriptors. Facts from the PTX ISA (docs/fused.md, "Blackwell"):
//
// - TMEM is 128 lanes x 512 columns of 32 bits per SM. One warp allocates a power of two of columns
//   (at least 32) with tcgen05.alloc, which writes the allocation's address (lane in bits 31..16,
//   column in 15..0) to shared memory, and frees it with tcgen05.dealloc.
// - tcgen05.mma.cta_group::1.kind::f16 [d], a_desc, b_desc, idesc, accumulate: D (M x N, f32) +=
//   A (M x 16) B (16 x N) for f16/bf16 operands; with M = 128, row i of D is lane i, its columns
//   consecutive TMEM columns from d. The instruction descriptor says the types, M, N and the
//   operands' majorness; the shared-memory descriptors are Hopper's with a version field and a
//   3-bit layout code.
// - tcgen05.commit makes an mbarrier arrive once every product issued before it is done;
//   tcgen05.ld copies TMEM to registers (a warp reaches only lanes 32 (w % 4) .. + 31) and
//   tcgen05.wait::ld waits for those copies.
//
// Compiled only for sm_100a (the `a` features); elsewhere the functions are empty. No device of
// that kind is lent here, so nothing in kernels/sm100 has run (docs/fused.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/sm80/mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM100_ALL)
#define EXPANSE_SM100A_DEVICE 1
#else
#define EXPANSE_SM100A_DEVICE 0
#endif

namespace expanse_cuda {

// The shared-memory descriptor of an operand laid out with the 128-byte swizzle (rows of 128 bytes,
// the 16-byte chunks of row r at chunk ^ (r % 8), 1024-byte aligned atoms of 8 rows), as
// swizzled_row_offset (kernels/sm90/wgmma.cuh) lays it out: `lbo` and `sbo` as Hopper's (K-major:
// lbo unused, sbo between 8-row groups; MN-major: lbo between 64-element blocks of M or N, sbo
// between 8-row groups of K); version 1 (bits 46..48) and layout code 2 (SWIZZLE_128B, bits 61..63).
__device__ __forceinline__ uint64_t umma_swizzled_desc(const void* at, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint64_t addr = smem_address(at);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 46) | (uint64_t(2) << 61);
}

// The instruction descriptor of kind::f16 with f32 accumulation: A and B of type T (f16 or bf16),
// M x N, each K-major or MN-major.
template <class T>
__host__ __device__ constexpr uint32_t umma_f16_idesc(int M, int N, bool a_mn_major, bool b_mn_major) {
  constexpr uint32_t kFormat = std::is_same_v<T, __nv_bfloat16> ? 1 : 0;  // 0 = F16, 1 = BF16
  return (1u << 4)                                  // D: f32
         | (kFormat << 7) | (kFormat << 10)         // A, B formats
         | (uint32_t(a_mn_major) << 15) | (uint32_t(b_mn_major) << 16)
         | (uint32_t(N >> 3) << 17) | (uint32_t(M >> 4) << 24);
}

// Allocates `Columns` TMEM columns (a power of two from 32 to 512) for this CTA; the whole warp
// calls it, and the address lands in *dst (shared memory) for every thread after a CTA barrier.
template <int Columns>
__device__ __forceinline__ void tmem_alloc(uint32_t* dst) {
  static_assert(Columns >= 32 && Columns <= 512 && (Columns & (Columns - 1)) == 0, "TMEM: a power of two, 32..512");
#if EXPANSE_SM100A_DEVICE
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n" ::"r"(smem_address(dst)),
               "n"(Columns)
               : "memory");
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
#else
  (void)dst;
#endif
}
// Frees them (the whole warp that allocated, once every TMEM access is done).
template <int Columns>
__device__ __forceinline__ void tmem_dealloc(uint32_t taddr) {
#if EXPANSE_SM100A_DEVICE
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(taddr), "n"(Columns) : "memory");
#else
  (void)taddr;
#endif
}

// Orders tcgen05 operations before a thread synchronization (fence_before) with those after it
// (fence_after), as the PTX ISA's memory model asks around barriers.
__device__ __forceinline__ void tcgen05_fence_before() {
#if EXPANSE_SM100A_DEVICE
  asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tcgen05_fence_after() {
#if EXPANSE_SM100A_DEVICE
  asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
#endif
}

// d (TMEM) = A B + (accumulate ? d : 0), one thread issuing.
__device__ __forceinline__ void tcgen05_mma_f16(uint32_t d_tmem, uint64_t a_desc, uint64_t b_desc, uint32_t idesc,
                                                bool accumulate) {
#if EXPANSE_SM100A_DEVICE
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %4, 0;\n"
      " tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n" ::"r"(d_tmem),
      "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(int(accumulate))
      : "memory");
#else
  (void)d_tmem; (void)a_desc; (void)b_desc; (void)idesc; (void)accumulate;
#endif
}

// Makes `bar` (shared memory) arrive once when every product this thread issued before is done.
__device__ __forceinline__ void tcgen05_commit(uint64_t* bar) {
#if EXPANSE_SM100A_DEVICE
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(
                   smem_address(bar))
               : "memory");
#else
  (void)bar;
#endif
}

// 16 consecutive columns of this thread's lane (lane = 32 (warp % 4) + lane id, from `taddr`'s
// lane base) into r; valid after tcgen05_wait_ld.
__device__ __forceinline__ void tcgen05_ld_16(uint32_t taddr, uint32_t (&r)[16]) {
#if EXPANSE_SM100A_DEVICE
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x16.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
      "%15}, [%16];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]),
        "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15])
      : "r"(taddr)
      : "memory");
#else
  (void)taddr;
  for (int i = 0; i < 16; ++i) r[i] = 0;
#endif
}
__device__ __forceinline__ void tcgen05_wait_ld() {
#if EXPANSE_SM100A_DEVICE
  asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory");
#endif
}

}  // namespace expanse_cuda
