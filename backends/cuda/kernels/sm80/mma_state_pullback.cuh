// The state terms of dq and dk in power_attention_backward (docs/spec.md "Gradients", chunked form),
// on tensor cores (mma.sync, sm_80+), for p = 2 in the symmetric layout (and p = 1, below):
//   out_i = rho_i J_phi(y_i)^T U_i,   U_i = r_i M x_i + alpha_i z      (M [D, e] and z [D] of token i's chunk)
// dq: y = scale q, x = dout, r = 1 / den, alpha = dden, M, z the forward state entering the chunk,
//     rho = exp(Gc_i);
// dk: y = k, x = v, r = alpha = 1, M, z the cotangent of the state leaving the chunk, rho = exp(A_m - Gc_j).
// For p = 2, phi_(a,b)(y) = c_ab y_a y_b (a <= b; c_ab = sqrt 2 off the diagonal, 1 on it), so
//   J^T U = sum_(a<=b) c_ab U_(a,b) (y_b e_a + y_a e_b).
// The features are taken in tiles of 8 x 8 (a in block A, b in block B >= A; on the diagonal blocks
// the entries with a > b are zero), whose state rows are scaled by c_ab and split into b16 pairs
// hi + lo (by split_state_tiles_kernel, below; x is exact in b16, y is f32): c U for the tile is two
// 16 x 64 x e products per warp, as accurate as f32 states (the gates' gradient sums y . out over a chunk, where a b16 state's
// 2^-9 would add up to 5e-3 at P1). With c in the tile (and in its z entries), zeros where a > b, and
// r_i applied at the end (the tiles take U_i / r_i = M x_i + (alpha_i / r_i) z), each entry of the
// product costs the epilogue three instructions: the thread that holds c U_(a,b) for columns b adds
// c U y_a to out[b] (its own columns in every block B, in shared memory) and c U y_b to a partial sum
// for out[a] in registers, summed over the quad once per block A.
//
// For p = 1, phi is the identity (D = d): out_i = rho_i U_i, one tile of all 64 rows, no J_phi.
//
// The tiles come ready (split_state_tiles_kernel, a pass over the state before the pullback): each
// is the image of the CTA's shared-memory tile, hi then lo, copied by cp.async a tile ahead. Gathering
// the state rows, scaling and splitting them in every CTA took half the kernel's instructions (8 CTAs
// per chunk and head at c = 1024 did the same work).
//
// CTA: 8 warps, 128 tokens of one chunk and head (16 per warp), two CTAs per SM (128 registers).
//
// The tile product is a policy (Tiles): mma_pullback_tiles here (ldmatrix + mma.sync: each warp reads
// the whole tile from shared memory, which bounds the kernel at sm_90), wgmma_pullback_tiles in
// kernels/sm90/wgmma_state_pullback.cuh (each warpgroup reads it once). The rest is shared.
#pragma once

#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

struct pullback_params {
  const void* y;  // [b,t,H,d], the input dtype, last dim contiguous
  int64_t y_sb, y_st, y_sh;
  float y_scale;  // y is this times the tensor
  const void* x;  // [b,t,H,e], the input dtype, last dim contiguous
  int64_t x_sb, x_st, x_sh;
  const float* r;      // [b,t,H] contiguous; null: 1
  const float* alpha;  // [b,t,H] contiguous; null: 1
  const void* tiles;    // per (batch, chunk, kv head): the state's tiles (split_state_tiles_kernel)
  const float* ztiles;  // per (batch, chunk, kv head): each tile's z entries [64]
  // The epilogue finishes the gradient (what gpu/kernels/backward_outputs.hpp does without states):
  // grad = grad_scale (sum + out) in the input dtype and dot = pf am + y . out (y as staged, y_scale
  // times the tensor: q . dq for the queries, k . dk for the keys). Fused here, it saved a pass over
  // out in f32 and the finishing kernels' 0.3 + 0.3 ms at P1 t = 65536.
  const float* sum;    // [b,t,H,d] f32, contiguous: the pairs' part; null: none (update_state_backward)
  const float* am;     // [b,t,H] f32: sum of A_ij M_ij by row (queries) or by key; null: none
  expanse_tensor grad;  // [b,t,H,d], the input dtype
  float* dot;          // [b,t,H] f32: written
  float grad_scale, pf;
  gates g;             // rho: exp(Gc_i) (queries) or exp(total - Gc_j) (keys, g.keys())
  int keys;            // 1: rho = exp(total - Gc_j)
  int64_t t, c, n, H, h;
  int token_tiles;
};

namespace pullback_cfg {
constexpr int kThreads = 256, kRows = 128;
// The tiles of a state: 8 x 8 feature blocks (A, B >= A) at p = 2, one tile of all rows at p = 1.
template <int kP, int DH>
constexpr int state_tiles() { return kP == 1 ? 1 : (DH / 8) * (DH / 8 + 1) / 2; }
}

// The state of a chunk and kv head as the pullback's tiles, in the kernel's order (A, then B >= A):
// each tile's shared-memory image (Tiles::offset), hi then lo, rows times c_ab, zero rows where a > b
// (and in the padding); its z entries times c_ab in ztiles.
struct split_tiles_params {
  const float* M;  // [b,n,h,D,e] f32, last dim contiguous
  int64_t M_sb, M_sn, M_sh, M_sr;
  const float* z;  // [b,n,h,D] f32, last dim contiguous; null: zeros
  int64_t z_sb, z_sn, z_sh;
  void* tiles;     // [b,n,h][state_tiles][2 kElems], the input dtype
  float* ztiles;   // [b,n,h][state_tiles][64]
  int64_t n, h;
};

// The tile product with mma.sync: a tile is [64][E + 8] b16 (rows padded against bank conflicts), u
// = x M^T by ldmatrix and mma.sync per warp.
template <class T, int E>
struct mma_pullback_tiles {
  using type = T;
  static constexpr int kElems = 64 * (E + 8);
  static constexpr bool kLoadsAhead = false;  // state_pullback_kernel's prologue and epilogue: see there
  // The element offset of tile row tr, column col.
  __device__ static int offset(int tr, int col) { return tr * (E + 8) + col; }
  // The row and first column of the tile's 8-element run c (offset 8 c); false: padding.
  __device__ static bool run_at(int c, int& tr, int& col) {
    tr = c / (E / 8 + 1), col = c % (E / 8 + 1) * 8;
    return col < E;
  }
  __device__ static void before_barrier() {}  // after the tile's copies
  // u = (this warp's 16 rows of x) (hi + lo)^T, all in product_start (mma.sync is synchronous).
  __device__ static void product_start(float (&u)[8][4], const uint32_t (&xa)[E / 16][4], const T* hi, const T* lo,
                                       int lane) {
    rows_times_rows<T, E>(u, xa, hi, E + 8, lane);
    add_rows_times_rows<T, E>(u, xa, lo, E + 8, lane);
  }
  __device__ static void product_wait(float (&)[8][4], int) {}
};

template <class T, int DH, int E, class Tiles>
constexpr size_t pullback_smem() {
  using namespace pullback_cfg;
  return size_t(kRows) * (E + 8) * sizeof(T) + size_t(2 * Tiles::kElems) * sizeof(T) + size_t(kRows) * (DH + 4) * sizeof(float) +
         (2 * 64 + 3 * kRows) * sizeof(float) + size_t(kRows) * (DH + 4) * sizeof(float);
}

// The state rows of tile (A, B) (its row tr: features a = 8 A + tr / 8, b = 8 B + tr % 8) and their
// coefficients; -1 where a > b. For p = 1 (phi the identity) the one tile holds every row.
template <int kP, int DH>
__device__ __forceinline__ int tile_state_row(int A, int B, int tr) {
  if constexpr (kP == 1) return tr;
  const int a = A * 8 + tr / 8, b = B * 8 + tr % 8;
  return a <= b ? int(sympow2_row(DH, a, b)) : -1;
}
template <int kP>
__device__ __forceinline__ float tile_coef(int A, int B, int tr) {
  return kP == 1 ? 1.f : sympow2_coef(A * 8 + tr / 8, B * 8 + tr % 8);
}

// One CTA per tile of a chunk and kv head: 16 bytes of hi and of lo per 8-element run of the image.
template <class T, int DH, int E, int kP, class Tiles>
__global__ void __launch_bounds__(256) split_state_tiles_kernel(split_tiles_params P) {
  constexpr int kTiles = pullback_cfg::state_tiles<kP, DH>(), kBlocks = DH / 8;
  const int64_t state = blockIdx.x / kTiles;  // (batch, chunk, kv head), kv fastest
  const int tile = blockIdx.x % kTiles;
  int ti = tile, A = 0;
  while (ti >= kBlocks - A) ti -= kBlocks - A, ++A;  // tile (A, B): B - A = what is left
  const int B = A + ti;
  const int64_t kv = state % P.h, m = state / P.h % P.n, batch = state / P.h / P.n;
  const float* Mbase = P.M + batch * P.M_sb + m * P.M_sn + kv * P.M_sh;
  T* hi = static_cast<T*>(P.tiles) + (state * kTiles + tile) * 2 * Tiles::kElems;
  T* lo = hi + Tiles::kElems;
  for (int c = threadIdx.x; c < Tiles::kElems / 8; c += blockDim.x) {
    int tr, col;
    uint4 h = make_uint4(0, 0, 0, 0), l = h;
    const int srow = Tiles::run_at(c, tr, col) ? tile_state_row<kP, DH>(A, B, tr) : -1;
    if (srow >= 0) {
      const float coef = tile_coef<kP>(A, B, tr);
      const float4 x0 = *reinterpret_cast<const float4*>(Mbase + srow * P.M_sr + col);
      const float4 x1 = *reinterpret_cast<const float4*>(Mbase + srow * P.M_sr + col + 4);
      split2_f32<T>(coef * x0.x, coef * x0.y, h.x, l.x);
      split2_f32<T>(coef * x0.z, coef * x0.w, h.y, l.y);
      split2_f32<T>(coef * x1.x, coef * x1.y, h.z, l.z);
      split2_f32<T>(coef * x1.z, coef * x1.w, h.w, l.w);
    }
    *reinterpret_cast<uint4*>(hi + 8 * c) = h;
    *reinterpret_cast<uint4*>(lo + 8 * c) = l;
  }
  if (threadIdx.x < 64) {
    const int srow = tile_state_row<kP, DH>(A, B, threadIdx.x);
    P.ztiles[(state * kTiles + tile) * 64 + threadIdx.x] =
        P.z && srow >= 0 ? tile_coef<kP>(A, B, threadIdx.x) * P.z[batch * P.z_sb + m * P.z_sn + kv * P.z_sh + srow] : 0.f;
  }
}

template <class T, int DH, int E, int kP, class Tiles>
__global__ void __launch_bounds__(256, 2) state_pullback_kernel(pullback_params P) {
  static_assert(kP == 1 || kP == 2, "state_pullback_kernel: p must be 1 or 2");
  using namespace pullback_cfg;
  // y and out rows padded by 4 floats: the epilogue reads them as float4 and float2 (shared memory
  // bounds the kernel: 71% L1 throughput at P1 t = 65536 with element-wise reads), and a float4 of 8
  // rows then falls in 8 different bank quads.
  constexpr int kXS = E + 8, kYS = DH + 4, kBlocks = DH / 8, kTiles = state_tiles<kP, DH>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Two tile buffers (p = 2): each tile's hi and lo (Tiles::offset, as copied) and z entries [64]. The
  // second takes the place of x's rows once every warp holds its fragments, so that two CTAs still fit
  // an SM.
  static_assert(2 * Tiles::kElems <= kRows * kXS, "the second tile buffer fits in x's rows");
  T* xs = reinterpret_cast<T*>(smem_raw);  // [kRows][kXS]
  T* ms = xs + kRows * kXS;                // buffer 0: hi, lo
  float* ys = reinterpret_cast<float*>(ms + 2 * Tiles::kElems);  // [kRows][kYS]
  float* zs = ys + kRows * kYS;                          // buffer 0's z, then buffer 1's
  float* al = zs + 2 * 64;                               // [kRows]: alpha
  float* rho = al + kRows;                               // [kRows]
  float* rs = rho + kRows;                               // [kRows]: r

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const cta_coords at = decode_cta(P.token_tiles, P.H, P.n);
  const int64_t head = at.head, m = at.chunk, batch = at.batch, kv = head / (P.H / P.h), bh = batch * P.h + kv;
  const int64_t first = m * P.c, len = min(P.c, P.t - first);
  const int r0 = at.tile * kRows;
  if (r0 >= len) return;

  // Buffer `buf`'s hi (lo follows) and z; tile `tile` of this chunk's state copied into it (one
  // cp.async group).
  auto hi_of = [&](int buf) { return buf ? xs : ms; };
  auto z_of = [&](int buf) { return zs + buf * 64; };
  const int64_t state = (batch * P.n + m) * P.h + kv;
  const T* tile0 = static_cast<const T*>(P.tiles) + state * kTiles * 2 * Tiles::kElems;
  const float* ztile0 = P.ztiles + state * kTiles * 64;
  auto copy_tile = [&](int tile, int buf) {
    copy_async_chunks<2 * Tiles::kElems / 8, kThreads>(hi_of(buf), tile0 + int64_t(tile) * 2 * Tiles::kElems, tid);
    if (tid < 16) copy_async<16>(z_of(buf) + 4 * tid, ztile0 + tile * 64 + 4 * tid, true);
    copy_async_commit();
  };
  copy_tile(0, 0);

  const T* xbase = static_cast<const T*>(P.x) + batch * P.x_sb + head * P.x_sh;
  const T* ybase = static_cast<const T*>(P.y) + batch * P.y_sb + head * P.y_sh;
  // The rows of x and y. With Tiles::kLoadsAhead as 16-byte vectors, every load issued before the
  // first store (y read element by element, each load waited for in turn, was the largest stall
  // outside the tile loop: ncu, P1 t = 65536); else element-wise (the mma.sync kernel, at 128
  // registers, spilled with the vectors on sm_80).
  constexpr int kXVecs = kRows * E / 8 / kThreads, kYVecs = kRows * DH / 8 / kThreads;
  static_assert(kXVecs * kThreads == kRows * E / 8 && kYVecs * kThreads == kRows * DH / 8, "whole vectors per thread");
  auto row_vector = [&](const T* base, int64_t stride, int per_row, int vi) {
    const int s = vi / per_row, c8 = vi % per_row;
    return r0 + s < len ? *reinterpret_cast<const uint4*>(base + (first + r0 + s) * stride + c8 * 8) : make_uint4(0, 0, 0, 0);
  };
  [[maybe_unused]] uint4 xv[kXVecs], yv[kYVecs];
  if constexpr (Tiles::kLoadsAhead) {
#pragma unroll
    for (int l = 0; l < kXVecs; ++l) xv[l] = row_vector(xbase, P.x_st, E / 8, tid + l * kThreads);
#pragma unroll
    for (int l = 0; l < kYVecs; ++l) yv[l] = row_vector(ybase, P.y_st, DH / 8, tid + l * kThreads);
  } else {
    for (int vi = tid; vi < kRows * E / 8; vi += kThreads)
      *reinterpret_cast<uint4*>(xs + vi / (E / 8) * kXS + vi % (E / 8) * 8) = row_vector(xbase, P.x_st, E / 8, vi);
    for (int vi = tid; vi < kRows * DH; vi += kThreads) {
      const int s = vi / DH, col = vi % DH;
      ys[s * kYS + col] = r0 + s < len ? P.y_scale * to_f32(ybase[(first + r0 + s) * P.y_st + col]) : 0.f;
    }
  }
  if (tid < kRows) {
    const bool in = r0 + tid < len;
    const int64_t i = first + r0 + tid;
    al[tid] = in && P.alpha ? P.alpha[(batch * P.t + i) * P.H + head] : 1.f;
    rs[tid] = in && P.r ? P.r[(batch * P.t + i) * P.H + head] : 1.f;
    float w = 0.f;
    if (in) {
      w = P.keys ? P.g.to_chunk_end(bh, P.t, P.n, m, i) : expf(P.g.cum(bh, P.t, i));
    }
    rho[tid] = w;
  }
  if constexpr (Tiles::kLoadsAhead) {
#pragma unroll
    for (int l = 0; l < kXVecs; ++l) {
      const int vi = tid + l * kThreads;
      *reinterpret_cast<uint4*>(xs + vi / (E / 8) * kXS + vi % (E / 8) * 8) = xv[l];
    }
#pragma unroll
    for (int l = 0; l < kYVecs; ++l) {
      const int vi = tid + l * kThreads;
      float f[8];
      unpack8<T>(yv[l], f);
      float4* dst = reinterpret_cast<float4*>(ys + vi / (DH / 8) * kYS + vi % (DH / 8) * 8);
      dst[0] = make_float4(P.y_scale * f[0], P.y_scale * f[1], P.y_scale * f[2], P.y_scale * f[3]);
      dst[1] = make_float4(P.y_scale * f[4], P.y_scale * f[5], P.y_scale * f[6], P.y_scale * f[7]);
    }
  }
  __syncthreads();

  uint32_t xa[E / 16][4];
#pragma unroll
  for (int kk = 0; kk < E / 16; ++kk) ldmatrix_x4(xa[kk], xs + (warp * 16 + (lane & 15)) * kXS + kk * 16 + (lane >> 4) * 8);
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  // The tiles accumulate J_phi^T (u + (alpha / r) z), whose r the end applies with rho: one
  // multiply-add per product entry instead of two (r = 0, an infinite denominator, drops the z term).
  float az_row[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float r = rs[row[hf]];
    az_row[hf] = r != 0.f ? al[row[hf]] / r : 0.f;
  }

  // out[row][col] accumulates in shared memory, each entry owned by one thread (the columns 8 B + 2 tq + j
  // of its rows), so that the loops over the tiles need not be unrolled to keep it in registers (255
  // registers and one CTA per SM when they were).
  float* outs = reinterpret_cast<float*>(rs + kRows);  // [kRows][kYS]
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    for (int col = 2 * tq; col < DH; col += 8) outs[row[hf] * kYS + col] = outs[row[hf] * kYS + col + 1] = 0.f;

  __syncthreads();  // every warp holds its x fragments: x's rows become tile buffer 1
  if (kTiles > 1) {
    copy_tile(1, 1);
    copy_async_wait<1>();
  } else {
    copy_async_wait<0>();
  }
  Tiles::before_barrier();
  __syncthreads();  // tile 0 has landed
  if constexpr (kP == 1) {  // out = r M x + alpha z itself: one tile, no J_phi
    float u[8][4];
    Tiles::product_start(u, xa, ms, ms + Tiles::kElems, lane);
    Tiles::product_wait(u, 0);
    Tiles::product_wait(u, 1);
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hf = i >> 1, tr = k * 8 + 2 * tq + (i & 1);  // the thread's own columns of out
        outs[row[hf] * kYS + tr] += fmaf(az_row[hf], zs[tr], u[k][i]);
      }
  } else {
    // The tiles (A, B >= A) in order, double-buffered with one barrier per tile: while tile `tile` is
    // multiplied from buffer `buf`, tile + 1 lands in the other buffer (copied a tile earlier); the
    // barrier after the epilogue publishes it and frees this buffer for tile + 2. (With the tiles
    // formed in the kernel and a barrier before and after each tile's stores, barrier stalls were 22%
    // of the samples; ncu, P1 t = 65536.)
    int buf = 0, tile = 0;
#pragma unroll 1
    for (int A = 0; A < kBlocks; ++A) {
      float part[8][2];  // partial out[row][8 A + k], this thread's columns only
#pragma unroll
      for (int k = 0; k < 8; ++k) part[k][0] = part[k][1] = 0.f;
#pragma unroll 1
      for (int B = A; B < kBlocks; ++B, ++tile) {
        float u[8][4];
        const T* hi = hi_of(buf);
        Tiles::product_start(u, xa, hi, hi + Tiles::kElems, lane);
        const float* zt = z_of(buf);
        // y and out at [row][8 B + 2 tq + j], y at [row][8 A + k] four k at a time, z of the tile's
        // rows k * 8 + 2 tq + j.
        float2 yb[2], ob[2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) yb[hf] = *reinterpret_cast<const float2*>(ys + row[hf] * kYS + B * 8 + 2 * tq);
#pragma unroll
        for (int k4 = 0; k4 < 2; ++k4) {  // the product's halves: u[4 k4 .. 4 k4 + 3]
          Tiles::product_wait(u, k4);
          float4 ya[2];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) ya[hf] = *reinterpret_cast<const float4*>(ys + row[hf] * kYS + A * 8 + 4 * k4);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const int k = 4 * k4 + kk;
            const float2 zk = *reinterpret_cast<const float2*>(zt + k * 8 + 2 * tq);
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const float y_a = kk == 0 ? ya[hf].x : kk == 1 ? ya[hf].y : kk == 2 ? ya[hf].z : ya[hf].w;
              const float cu0 = fmaf(az_row[hf], zk.x, u[k][2 * hf]);
              const float cu1 = fmaf(az_row[hf], zk.y, u[k][2 * hf + 1]);
              part[k][hf] = fmaf(cu1, yb[hf].y, fmaf(cu0, yb[hf].x, part[k][hf]));
              ob[hf].x = fmaf(cu0, y_a, ob[hf].x);
              ob[hf].y = fmaf(cu1, y_a, ob[hf].y);
            }
          }
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float2& o = *reinterpret_cast<float2*>(outs + row[hf] * kYS + B * 8 + 2 * tq);
          o.x += ob[hf].x, o.y += ob[hf].y;
        }
        if (tile + 1 < kTiles) {
          copy_async_wait<0>();  // tile + 1
          Tiles::before_barrier();
        }
        __syncthreads();  // the next tile has landed, this one is no longer read
        if (tile + 2 < kTiles) copy_tile(tile + 2, buf);
        buf ^= 1;
      }
      // out[row][8 A + k] from the quad's partial sums; the thread whose columns hold k adds it.
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          part[k][hf] += __shfl_xor_sync(0xffffffffu, part[k][hf], 1);
          part[k][hf] += __shfl_xor_sync(0xffffffffu, part[k][hf], 2);
        }
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k / 2 == tq)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) outs[row[hf] * kYS + A * 8 + k] += part[k][hf];
    }
  }

  // The pairs' sums of the CTA's rows, staged in shared memory over x's rows and tile buffer 0 (free
  // once no warp reads a tile): every load in flight at once. (Read per column in the loop below,
  // after the stores of the column before, which the compiler cannot move them past, they were 15% of
  // the stall samples: ncu, P1 t = 65536; loaded ahead in registers, they spilled at the mma.sync
  // kernel's 128; so does this staging, which it leaves out: Tiles::kLoadsAhead.)
  float* sums = reinterpret_cast<float*>(smem_raw);  // [kRows][kYS]
  static_assert(kRows * kYS * sizeof(float) <= (kRows * kXS + 2 * Tiles::kElems) * sizeof(T), "the sums fit");
  if (Tiles::kLoadsAhead && P.sum) {
    __syncthreads();  // every warp is past its last product
    constexpr int kChunks = kRows * DH / 4;  // 16-byte chunks
    static_assert(kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
    for (int l = 0; l < kChunks / kThreads; ++l) {
      const int c = tid + l * kThreads, s = c / (DH / 4), c4 = c % (DH / 4);
      const bool in = r0 + s < len;
      const int64_t token_row = (batch * P.t + first + r0 + (in ? s : 0)) * P.H + head;
      copy_async<16>(sums + s * kYS + 4 * c4, P.sum + token_row * DH + 4 * c4, in);
    }
    copy_async_commit();
    copy_async_wait<0>();
    __syncthreads();
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = row[hf];
    const bool in = r0 + r < len;  // every lane takes part in the quad's sum below
    const int64_t i = first + r0 + r, token_row = (batch * P.t + i) * P.H + head;
    const float w = rho[r] * rs[r];
    float dot = 0.f;
    for (int col = 2 * tq; col < DH; col += 8) {
      const float s0 = w * outs[r * kYS + col], s1 = w * outs[r * kYS + col + 1];
      dot = fmaf(ys[r * kYS + col], s0, fmaf(ys[r * kYS + col + 1], s1, dot));
      if (!in) continue;
      const float* pair = Tiles::kLoadsAhead ? sums + r * kYS + col : P.sum + token_row * DH + col;
      const float2 pairs = P.sum ? *reinterpret_cast<const float2*>(pair) : float2{0.f, 0.f};
      T* g = static_cast<T*>(P.grad.data) + off4(P.grad, batch, i, head, col);
      g[0] = from_f32<T>(P.grad_scale * (pairs.x + s0));
      g[P.grad.strides[3]] = from_f32<T>(P.grad_scale * (pairs.y + s1));
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
    if (in && tq == 0) P.dot[token_row] = P.am ? fmaf(P.pf, P.am[token_row], dot) : dot;
  }
}

}  // namespace expanse_cuda
