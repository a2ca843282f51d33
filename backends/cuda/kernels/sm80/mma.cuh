// Warp-level tensor-core primitives of sm_80 and later (mma.sync, ldmatrix), for f16 and bf16
// operands with f32 accumulation. Fragment layouts follow the PTX ISA's m16n8k16 description:
// lane = 4 g + t holds A rows g and g+8, columns 2t, 2t+1, 2t+8, 2t+9; B columns (n) g, rows (k)
// 2t, 2t+1, 2t+8, 2t+9; C rows g and g+8, columns 2t and 2t+1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace expanse_cuda {

template <class T> struct mma_type;
template <> struct mma_type<__half> { using pair = __half2; };
template <> struct mma_type<__nv_bfloat16> { using pair = __nv_bfloat162; };

// c += a * b on one 16x8x16 tile.
template <class T>
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, const uint32_t* b);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One 16-byte shared-memory read (16-byte aligned `p`), kept whole: where each word of a plain
// uint4 read feeds a different instruction, the compiler may split it into four 4-byte reads, four
// times the shared-memory wavefronts. (volatile: it stays after the barrier waits before it.)
__device__ __forceinline__ uint4 load_shared_16(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_address(p)));
  return v;
}
// One 16-byte shared-memory write (16-byte aligned `p`), kept whole for the same reason.
__device__ __forceinline__ void store_shared_16(void* p, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(p)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Four 8x8 b16 matrices; lane L gives the row address of matrix L/8, row L%8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row)));
}

// Two b16 values as one 32-bit register (lo in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  const uint16_t l = reinterpret_cast<const uint16_t&>(lo), h = reinterpret_cast<const uint16_t&>(hi);
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}
template <class T>
__device__ __forceinline__ uint32_t pack2_f32(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2_f32<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<uint32_t&>(v);
}
template <>
__device__ __forceinline__ uint32_t pack2_f32<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return reinterpret_cast<uint32_t&>(v);
}

// Asynchronous global -> shared copies (cp.async, sm_80+): `bytes` (4 or 16) from src, or zeros when
// `valid` is false (src is then not read). Each thread commits its copies as groups and waits until
// at most N of its groups are in flight; a barrier then makes every thread's copies visible.
template <int bytes>
__device__ __forceinline__ void copy_async(void* dst, const void* src, bool valid) {
  static_assert(bytes == 4 || bytes == 16, "cp.async copies 4 or 16 bytes here");
  const int src_bytes = valid ? bytes : 0;
  if constexpr (bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes) : "memory");
}
// Copies `Chunks` 16-byte chunks from src to dst by cp.async, over `Threads` threads (this one
// `tid`), with a fixed trip count and the copies two at a time at immediate offsets (a loop with a
// bound check per copy took a third of the state pullback's instructions per tile).
template <int Chunks, int Threads, class T>
__device__ __forceinline__ void copy_async_chunks(T* dst, const T* src, int tid) {
  constexpr int kPer = 16 / int(sizeof(T)), kFull = Chunks / Threads, kTail = Chunks % Threads;
  dst += kPer * tid, src += kPer * tid;
#pragma unroll 2
  for (int i = 0; i < kFull; ++i) copy_async<16>(dst + kPer * i * Threads, src + kPer * i * Threads, true);
  if (kTail != 0 && tid < kTail) copy_async<16>(dst + kPer * kFull * Threads, src + kPer * kFull * Threads, true);
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void copy_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// The two f32 values of a packed b16 pair.
template <class T>
__device__ __forceinline__ float2 unpack2_f32(uint32_t w) {
  using P = typename mma_type<T>::pair;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat1622float2(reinterpret_cast<const P&>(w));
  else return __half22float2(reinterpret_cast<const P&>(w));
}

// Splits two f32 values into packed b16 pairs hi + lo (hi rounded, lo the rounded remainder): the
// pair sum keeps about 16 significant bits, where hi alone keeps 8 (bf16).
template <class T>
__device__ __forceinline__ void split2_f32(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack2_f32<T>(x0, x1);
  const float2 h = unpack2_f32<T>(hi);
  lo = pack2_f32<T>(x0 - h.x, x1 - h.y);
}

// The low (hi = 0) or the high (hi = 1) b16 of a packed pair, in both halves.
__device__ __forceinline__ uint32_t b16_twice(uint32_t pair, int hi) { return __byte_perm(pair, pair, hi ? 0x3232 : 0x1010); }

// Element-wise product of two packed pairs (one rounding: the exact product of two b16 values
// fits in f32, so this equals multiplying in f32 and rounding once).
template <class T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  using P = typename mma_type<T>::pair;
  P r = __hmul2(reinterpret_cast<const P&>(a), reinterpret_cast<const P&>(b));
  return reinterpret_cast<uint32_t&>(r);
}

// The same product as hi + lo pairs: hi = mul2(a, b), lo = a * b - hi by one fused multiply-add
// (single rounding), so that hi + lo is the exact product of two b16 values in the normal range.
template <class T>
__device__ __forceinline__ void mul2_split(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  using P = typename mma_type<T>::pair;
  const P& pa = reinterpret_cast<const P&>(a);
  const P& pb = reinterpret_cast<const P&>(b);
  const P h = __hmul2(pa, pb);
  const P l = __hfma2(pa, pb, __hneg2(h));
  hi = reinterpret_cast<const uint32_t&>(h);
  lo = reinterpret_cast<const uint32_t&>(l);
}

// a (b_hi + b_lo) as hi + lo pairs, where b_hi + b_lo is an f32 value split (split2_f32): hi =
// mul2(a, b_hi), lo = a b_lo + (a b_hi - hi) by two fused multiply-adds (the inner one exact, as in
// mul2_split; the outer rounds once), so that hi + lo keeps about 16 significant bits of the f32
// product, like splitting it, in 3 packed instructions per pair where the f32 product and its split
// take about 12.
template <class T>
__device__ __forceinline__ void mul2_split(uint32_t a, uint32_t b_hi, uint32_t b_lo, uint32_t& hi, uint32_t& lo) {
  using P = typename mma_type<T>::pair;
  const P& pa = reinterpret_cast<const P&>(a);
  const P& ph = reinterpret_cast<const P&>(b_hi);
  const P h = __hmul2(pa, ph);
  const P l = __hfma2(pa, reinterpret_cast<const P&>(b_lo), __hfma2(pa, ph, __hneg2(h)));
  hi = reinterpret_cast<const uint32_t&>(h);
  lo = reinterpret_cast<const uint32_t&>(l);
}

// Word w (0..3, a compile-time index after unrolling) of a 16-byte vector.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }

// mul2 on each of the four words of two 16-byte vectors.
template <class T>
__device__ __forceinline__ uint4 mul2x4(const uint4& a, const uint4& b) {
  return make_uint4(mul2<T>(a.x, b.x), mul2<T>(a.y, b.y), mul2<T>(a.z, b.z), mul2<T>(a.w, b.w));
}

// Warp tile products. c += A B^T: A is this warp's 16 rows over W (as A fragments), B the 8 NT rows
// of a [8 NT][W] b16 tile in shared memory (row stride `stride`); c is 16 x 8 NT as NT n-tiles.
template <class T, int W, int NT = 8>
__device__ __forceinline__ void add_rows_times_rows(float (&c)[NT][4], const uint32_t (&a)[W / 16][4], const T* b_rows,
                                                    int stride, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int kk = 0; kk < W / 16; kk += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_rows + (nt * 8 + (lane & 7)) * stride + kk * 16 + (lane >> 3) * 8);
      mma_16816<T>(c[nt], a[kk], b);
      if (kk + 1 < W / 16) mma_16816<T>(c[nt], a[kk + 1], b + 2);
    }
  }
}

// c = A B^T (as add_rows_times_rows).
template <class T, int W, int NT = 8>
__device__ __forceinline__ void rows_times_rows(float (&c)[NT][4], const uint32_t (&a)[W / 16][4], const T* b_rows,
                                                int stride, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[nt][i] = 0.f;
  add_rows_times_rows<T, W, NT>(c, a, b_rows, stride, lane);
}

// acc (16 x W) += A (16 x 16 KS, as A fragments over the 16 KS) times a [16 KS][W] b16 tile in shared
// memory.
template <class T, int W, int KS = 4>
__device__ __forceinline__ void add_times_tile(float (&acc)[W / 8][4], const uint32_t (&a)[KS][4], const T* tile,
                                               int stride, int lane) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    const int brow = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < W / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, tile + brow * stride + np * 16 + (lane >> 4) * 8);
      mma_16816<T>(acc[2 * np], a[kk], b);
      mma_16816<T>(acc[2 * np + 1], a[kk], b + 2);
    }
  }
}

}  // namespace expanse_cuda
