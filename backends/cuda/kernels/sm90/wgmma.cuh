// Warpgroup-level tensor-core primitives of sm_90a (wgmma), for f16 and bf16 operands with f32
// accumulation. A warpgroup is 4 consecutive warps (128 threads) starting at a warp index divisible
// by 4; together they issue one m64nNk16 product: A (64 x 16) from registers, B (16 x N) from
// shared memory through a descriptor, D (64 x N) in registers.
//
// Fragments (PTX ISA, "wgmma .m64nNk16"): warp w of the warpgroup owns rows 16w..16w+15 and, within
// them, has the m16n8k16 layout of mma.sync: lane 4g + t holds A rows g and g+8 at columns 2t, 2t+1
// (registers 0, 1) and 2t+8, 2t+9 (registers 2, 3), and D rows g and g+8 at columns 8j + 2t, 8j + 2t+1
// (registers 4j, 4j+1 for row g and 4j+2, 4j+3 for row g+8) of every 8-column block j.
//
// B in shared memory, K-major without swizzling: "core matrices" of 8 rows (n) x 16 bytes (8 k values),
// each 128 contiguous bytes; the descriptor gives the byte distance between core matrices adjacent
// in k (leading byte offset) and in n (stride byte offset).
//
// Compiled only for sm_90a (the `a` features); elsewhere the functions are empty and the callers'
// dispatch never launches them (sm90a_available in ops/op_common.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/sm80/mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define EXPANSE_SM90A_DEVICE 1
#else
#define EXPANSE_SM90A_DEVICE 0
#endif

namespace expanse_cuda {

// Descriptor of a K-major, unswizzled B tile starting at `tile` (16-byte aligned shared memory).
__device__ __forceinline__ uint64_t kmajor_desc(const void* tile, uint32_t k_stride_bytes, uint32_t n_stride_bytes) {
  const uint64_t addr = smem_address(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((k_stride_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((n_stride_bytes >> 4) & 0x3FFF) << 32);
}

// Descriptor of an N-major, unswizzled B tile starting at `tile` (16-byte aligned): core matrices of
// 8 k rows x 16 bytes (8 n values), each 128 contiguous bytes, `k8_stride_bytes` apart along k and
// `n8_stride_bytes` apart along n (the canonical MN-major layout without swizzle, whose descriptor
// fields take these the other way round from the swizzled one below).
__device__ __forceinline__ uint64_t nmajor_desc(const void* tile, uint32_t k8_stride_bytes, uint32_t n8_stride_bytes) {
  const uint64_t addr = smem_address(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((k8_stride_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((n8_stride_bytes >> 4) & 0x3FFF) << 32);
}

// Descriptor of an N-major B tile with 128- or 64-byte swizzling (`row_bytes`: 128 or 64) starting at
// `tile` (aligned to 8 rows, 1024 or 512 bytes): K rows of row_bytes holding row_bytes / 2 values of
// N each, the 16-byte chunks of row k at chunk ^ (the row's address bits 7..), as
// swizzled_row_offset lays them out; 8-row groups along K `k8_stride_bytes` apart, blocks of
// row_bytes / 2 columns along N `n_block_stride_bytes` apart.
__device__ __forceinline__ uint64_t nmajor_swizzled_desc(const void* tile, uint32_t row_bytes, uint32_t n_block_stride_bytes,
                                                         uint32_t k8_stride_bytes) {
  const uint64_t addr = smem_address(tile);
  const uint64_t mode = row_bytes == 128 ? 1 : 2;  // 128- or 64-byte swizzle
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((n_block_stride_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((k8_stride_bytes >> 4) & 0x3FFF) << 32) | (mode << 62);
}
// Descriptor of a K-major B tile with 128-byte swizzling: rows of 128 bytes (64 k values of one n),
// laid out as swizzled_row_offset(n, chunk, 128) from a 1024-byte aligned base, 8-row groups 1024
// bytes apart. `at` is the base plus the byte offset of the k16 slice within the rows (32 per slice);
// the leading byte offset is unused in this mode.
__device__ __forceinline__ uint64_t kmajor_swizzled_desc(const void* at) {
  const uint64_t addr = smem_address(at);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Orders this thread's register writes (A fragments, accumulators) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
#if EXPANSE_SM90A_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
#if EXPANSE_SM90A_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most `Pending` committed groups are still running.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
#if EXPANSE_SM90A_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}
// Makes this thread's ordinary shared-memory stores visible to the tensor cores' (async proxy)
// reads that follow the next barrier.
__device__ __forceinline__ void fence_async_shared() {
#if EXPANSE_SM90A_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accesses of an accumulator across in-flight wgmma.
template <int N>
__device__ __forceinline__ void wgmma_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Keeps the A fragments of an in-flight wgmma in their registers up to this point: once the wgmma's
// statement has read them the compiler would give their registers to other values, which the
// tensor cores may still be reading.
template <int M, int N>
__device__ __forceinline__ void wgmma_pin_fragments(uint32_t (&a)[M][N]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int n = 0; n < N; ++n) asm volatile("" : "+r"(a[m][n])::"memory");
}
// Zeroes MT accumulator tiles and pins them: the zeroing then stays ahead of the first wgmma, where
// ptxas would otherwise move it into the pipeline and serialize every wgmma (C7515,
// docs/performance.md).
template <int MT, int N>
__device__ __forceinline__ void wgmma_zero(float (&acc)[MT][N]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[mt][i] = 0.f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) wgmma_pin(acc[mt]);
}

// The operand lists of m64nNk16 (inline assembly cannot loop over registers); TY is "bf16" or "f16".
#define EXPANSE_WGMMA_RS_N32(TY, TB)                                                          \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " "                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "  \
      "{%16, %17, %18, %19}, %20, p, 1, 1, " TB ";\n}\n"                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),  \
        "+f"(d[15])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1))

#define EXPANSE_WGMMA_RS_N40(TY, TB)                                                          \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %25, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n40k16.f32." TY "." TY " "                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19}, "  \
      "{%20, %21, %22, %23}, %24, p, 1, 1, " TB ";\n}\n"                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),  \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1))

#define EXPANSE_WGMMA_RS_N64(TY, TB)                                                          \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "  \
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "  \
      "{%32, %33, %34, %35}, %36, p, 1, 1, " TB ";\n}\n"                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),  \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1))

#define EXPANSE_WGMMA_RS_N72(TY, TB)                                                          \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n72k16.f32." TY "." TY " "                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "  \
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, "  \
      "{%36, %37, %38, %39}, %40, p, 1, 1, " TB ";\n}\n"                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),  \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1))

#define EXPANSE_WGMMA_RS_N136(TY, TB)                                                          \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %73, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n136k16.f32." TY "." TY " "                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "  \
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "  \
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "  \
      "%59, %60, %61, %62, %63, %64, %65, %66, %67}, "  \
      "{%68, %69, %70, %71}, %72, p, 1, 1, " TB ";\n}\n"                     \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),  \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1))

// d (64 x N, f32) += a (64 x 16, registers) * B (16 x N, shared memory) for N = 40, 72, 136 (e + 8:
// e columns and one 8-wide tile beside them, for e = 32, 64, 128), 32 (half a state tile's rows in
// the backward's pullback) and 64 (e columns in the backward's tiles query). B is K-major (core
// matrices of 8 rows x 16 bytes of k, kmajor_desc), or N-major with kNMajorB (rows of N-contiguous
// values, nmajor_swizzled_desc or, unswizzled, nmajor_desc).
template <class T, int N, bool kNMajorB = false>
__device__ __forceinline__ void wgmma_rs(float* d, const uint32_t* a, uint64_t b_desc) {
  static_assert(N == 32 || N == 40 || N == 64 || N == 72 || N == 136, "wgmma_rs: N must be 32, 40, 64, 72 or 136");
#if EXPANSE_SM90A_DEVICE
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
#define EXPANSE_WGMMA_RS_CASE(MACRO)                      \
  if constexpr (bf16 && kNMajorB) MACRO("bf16", "1");     \
  else if constexpr (bf16) MACRO("bf16", "0");            \
  else if constexpr (kNMajorB) MACRO("f16", "1");         \
  else MACRO("f16", "0");
  if constexpr (N == 32) {
    EXPANSE_WGMMA_RS_CASE(EXPANSE_WGMMA_RS_N32)
  } else if constexpr (N == 40) {
    EXPANSE_WGMMA_RS_CASE(EXPANSE_WGMMA_RS_N40)
  } else if constexpr (N == 64) {
    EXPANSE_WGMMA_RS_CASE(EXPANSE_WGMMA_RS_N64)
  } else if constexpr (N == 72) {
    EXPANSE_WGMMA_RS_CASE(EXPANSE_WGMMA_RS_N72)
  } else {
    EXPANSE_WGMMA_RS_CASE(EXPANSE_WGMMA_RS_N136)
  }
#undef EXPANSE_WGMMA_RS_CASE
#else
  (void)d; (void)a; (void)b_desc;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched here (sm90a_available); fail loudly rather than compute nothing
#endif
#endif
}

// The operand lists of m64nNk16 with A from shared memory (TA, TB: the transpose flags).
#define EXPANSE_WGMMA_SS_N32(TY, TA, TB)                                                               \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                    \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " "                                     \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                       \
      "%16, %17, p, 1, 1, " TA ", " TB ";\n}\n"                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),        \
        "+f"(d[15])                                                                                     \
      : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)))

#define EXPANSE_WGMMA_SS_N64(TY, TA, TB)                                                               \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                    \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                     \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                                        \
      "%32, %33, p, 1, 1, " TA ", " TB ";\n}\n"                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),        \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),      \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),      \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                           \
      : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)))

// d (64 x N, f32) = A (64 x 16, shared memory) * B (16 x N, shared memory) + (accumulate ? d : 0) for
// N = 32 or 64: both operands by descriptor, no registers for A. K-major operands
// (kmajor_swizzled_desc) by default; kMNMajorA / kMNMajorB take A with its 64 rows contiguous
// (M-major) or B with its N columns contiguous (N-major), as nmajor_swizzled_desc describes them
// (16-bit types only).
template <class T, int N, bool kMNMajorA = false, bool kMNMajorB = false>
__device__ __forceinline__ void wgmma_ss(float* d, uint64_t a_desc, uint64_t b_desc, bool accumulate = true) {
  static_assert(N == 32 || N == 64, "wgmma_ss: N must be 32 or 64");
#if EXPANSE_SM90A_DEVICE
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
#define EXPANSE_WGMMA_SS_CASE(MACRO)                                           \
  if constexpr (bf16 && !kMNMajorA && !kMNMajorB) MACRO("bf16", "0", "0");     \
  else if constexpr (bf16 && kMNMajorA && kMNMajorB) MACRO("bf16", "1", "1");  \
  else if constexpr (bf16 && kMNMajorA) MACRO("bf16", "1", "0");               \
  else if constexpr (bf16) MACRO("bf16", "0", "1");                            \
  else if constexpr (!kMNMajorA && !kMNMajorB) MACRO("f16", "0", "0");         \
  else if constexpr (kMNMajorA && kMNMajorB) MACRO("f16", "1", "1");           \
  else if constexpr (kMNMajorA) MACRO("f16", "1", "0");                        \
  else MACRO("f16", "0", "1");
  if constexpr (N == 32) {
    EXPANSE_WGMMA_SS_CASE(EXPANSE_WGMMA_SS_N32)
  } else {
    EXPANSE_WGMMA_SS_CASE(EXPANSE_WGMMA_SS_N64)
  }
#undef EXPANSE_WGMMA_SS_CASE
#else
  (void)d; (void)a_desc; (void)b_desc; (void)accumulate;
#if defined(__CUDA_ARCH__)
  __trap();  // never dispatched here (sm90a_available)
#endif
#endif
}

// d += (a_hi + a_lo) (B_hi + B_lo) for operands split into b16 hi + lo (each lo under 2^-9 of its
// value): three products, without a_lo B_lo (under 2^-18 of the product).
template <class T, int N, bool kNMajorB = false>
__device__ __forceinline__ void wgmma_rs_split(float* d, const uint32_t* a_hi, const uint32_t* a_lo, uint64_t b_hi_desc,
                                               uint64_t b_lo_desc) {
  wgmma_rs<T, N, kNMajorB>(d, a_hi, b_hi_desc);
  wgmma_rs<T, N, kNMajorB>(d, a_hi, b_lo_desc);
  wgmma_rs<T, N, kNMajorB>(d, a_lo, b_hi_desc);
}

}  // namespace expanse_cuda
