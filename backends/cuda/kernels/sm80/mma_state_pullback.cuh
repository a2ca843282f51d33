// The state terms of dq and dk in power_attention_backward (docs/spec.md "Gradients", chunked form),
// on tensor cores (mma.sync, sm_80+), for p = 2 in the symmetric layout (and p = 1, below):
//   out_i = rho_i J_phi(y_i)^T U_i,   U_i = r_i M x_i + alpha_i z      (M [D, e] and z [D] of token i's chunk)
// dq: y = scale q, x = dout, r = 1 / den, alpha = dden, M, z the forward state entering the chunk,
//     rho = exp(Gc_i);
// dk: y = k, x = v, r = alpha = 1, M, z the cotangent of the state leaving the chunk, rho = exp(A_m - Gc_j).
// For p = 2, phi_(a,b)(y) = c_ab y_a y_b (a <= b; c_ab = sqrt 2 off the diagonal, 1 on it), so
//   J^T U = sum_(a<=b) c_ab U_(a,b) (y_b e_a + y_a e_b).
// The features are taken in tiles of 8 x 8 (a in block A, b in block B >= A; on the diagonal blocks
// the entries with a > b are zero), whose state rows the CTA gathers, scales by c_ab and splits into
// b16 pairs hi + lo (x is exact in b16, y is f32): c U for the tile is two 16 x 64 x e products per
// warp, as accurate as f32 states (the gates' gradient sums y . out over a chunk, where a b16 state's
// 2^-9 would add up to 5e-3 at P1). With c in the tile (and in its z entries) and zeros where a > b,
// each entry of the product costs the epilogue four instructions: the thread that holds c U_(a,b) for
// columns b adds c U y_a to out[b] (its own columns in every block B, in shared memory) and c U y_b to
// a partial sum for out[a] in registers, summed over the quad once per block A.
//
// For p = 1, phi is the identity (D = d): out_i = rho_i U_i, one tile of all 64 rows, no J_phi.
//
// CTA: 8 warps, 128 tokens of one chunk and head (16 per warp), two CTAs per SM (128 registers); the
// whole state is read once per CTA.
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
  const float* M;      // [b,n,h,D,e] f32, last dim contiguous
  int64_t M_sb, M_sn, M_sh, M_sr;
  const float* z;      // [b,n,h,D] f32, last dim contiguous; null: no z term
  int64_t z_sb, z_sn, z_sh;
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
}

// The tile product with mma.sync: a tile is [64][E + 8] b16 (rows padded against bank conflicts), u
// = x M^T by ldmatrix and mma.sync per warp.
template <class T, int E>
struct mma_pullback_tiles {
  using type = T;
  static constexpr int kElems = 64 * (E + 8);
  // The element offset of tile row tr, column col.
  __device__ static int offset(int tr, int col) { return tr * (E + 8) + col; }
  __device__ static void before_barrier() {}  // after the tile's stores
  // u = (this warp's 16 rows of x) (hi + lo)^T, all in product_start (mma.sync is synchronous).
  __device__ static void product_start(float (&u)[8][4], const uint32_t (&xa)[E / 16][4], const T* hi, const T* lo,
                                       int lane) {
    rows_times_rows<T, E>(u, xa, hi, E + 8, lane);
    add_rows_times_rows<T, E>(u, xa, lo, E + 8, lane);
  }
  __device__ static void product_finish(float (&)[8][4]) {}
};

template <class T, int DH, int E, class Tiles>
constexpr size_t pullback_smem() {
  using namespace pullback_cfg;
  return size_t(kRows) * (E + 8) * sizeof(T) + size_t(2 * Tiles::kElems) * sizeof(T) + size_t(kRows) * (DH + 4) * sizeof(float) +
         (2 * 64 + 3 * kRows) * sizeof(float) + size_t(kRows) * (DH + 4) * sizeof(float);
}

template <class T, int DH, int E, int kP, class Tiles>
__global__ void __launch_bounds__(256, 2) state_pullback_kernel(pullback_params P) {
  static_assert(kP == 1 || kP == 2, "state_pullback_kernel: p must be 1 or 2");
  using namespace pullback_cfg;
  // y and out rows padded by 4 floats: the epilogue reads them as float4 and float2 (shared memory
  // bounds the kernel: 71% L1 throughput at P1 t = 65536 with element-wise reads), and a float4 of 8
  // rows then falls in 8 different bank quads.
  constexpr int kXS = E + 8, kYS = DH + 4, kBlocks = DH / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Two tile buffers (p = 2): each tile's state rows hi and lo (Tiles::offset) and z entries [64]. The
  // second takes the place of x's rows once every warp holds its fragments, so that two CTAs still fit
  // an SM.
  static_assert(2 * Tiles::kElems <= kRows * kXS, "the second tile buffer fits in x's rows");
  T* xs = reinterpret_cast<T*>(smem_raw);  // [kRows][kXS]
  T* ms = xs + kRows * kXS;                // buffer 0: hi, lo
  T* ml = ms + Tiles::kElems;
  float* ys = reinterpret_cast<float*>(ml + Tiles::kElems);  // [kRows][kYS]
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

  const T* xbase = static_cast<const T*>(P.x) + batch * P.x_sb + head * P.x_sh;
  const T* ybase = static_cast<const T*>(P.y) + batch * P.y_sb + head * P.y_sh;
  for (int vi = tid; vi < kRows * E / 8; vi += kThreads) {
    const int s = vi / (E / 8), c8 = vi % (E / 8);
    *reinterpret_cast<uint4*>(xs + s * kXS + c8 * 8) =
        r0 + s < len ? *reinterpret_cast<const uint4*>(xbase + (first + r0 + s) * P.x_st + c8 * 8) : make_uint4(0, 0, 0, 0);
  }
  for (int vi = tid; vi < kRows * DH; vi += kThreads) {
    const int s = vi / DH, col = vi % DH;
    ys[s * kYS + col] = r0 + s < len ? P.y_scale * to_f32(ybase[(first + r0 + s) * P.y_st + col]) : 0.f;
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
  __syncthreads();

  uint32_t xa[E / 16][4];
#pragma unroll
  for (int kk = 0; kk < E / 16; ++kk) ldmatrix_x4(xa[kk], xs + (warp * 16 + (lane & 15)) * kXS + kk * 16 + (lane >> 4) * 8);
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const float r_row[2] = {rs[row[0]], rs[row[1]]}, al_row[2] = {al[row[0]], al[row[1]]};

  const float* Mbase = P.M + batch * P.M_sb + m * P.M_sn + kv * P.M_sh;
  const float* zbase = P.z ? P.z + batch * P.z_sb + m * P.z_sn + kv * P.z_sh : nullptr;
  // The state row of tile (A, B)'s row tr and its coefficient; -1 where a > b. For p = 1 (phi the
  // identity, D = DH) the one tile holds every row.
  auto state_row = [](int A, int B, int tr) {
    if constexpr (kP == 1) return tr;
    const int a = A * 8 + tr / 8, b = B * 8 + tr % 8;
    return a <= b ? int(sympow2_row(DH, a, b)) : -1;
  };
  auto coef_of = [](int A, int B, int tr) { return kP == 1 ? 1.f : sympow2_coef(A * 8 + tr / 8, B * 8 + tr % 8); };
  // Each thread gathers 4 of the tile's 64 x E state entries per pass: tile row = vi / (E / 4).
  constexpr int kLoads = 64 * E / 4 / kThreads;
  float4 next[kLoads];
  auto load_tile = [&](int A, int B) {
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int vi = tid + l * kThreads, tr = vi / (E / 4), c4 = vi % (E / 4), srow = state_row(A, B, tr);
      next[l] = srow >= 0 ? *reinterpret_cast<const float4*>(Mbase + srow * P.M_sr + c4 * 4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  // Buffer `buf`'s hi, lo and z.
  auto hi_of = [&](int buf) { return buf ? xs : ms; };
  auto lo_of = [&](int buf) { return buf ? xs + Tiles::kElems : ml; };
  auto z_of = [&](int buf) { return zs + buf * 64; };
  auto store_tile = [&](int A, int B, int buf) {
    T *hi_tile = hi_of(buf), *lo_tile = lo_of(buf);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int vi = tid + l * kThreads, tr = vi / (E / 4), c4 = vi % (E / 4);
      const float coef = coef_of(A, B, tr);
      uint2 hi, lo;
      split2_f32<T>(coef * next[l].x, coef * next[l].y, hi.x, lo.x);
      split2_f32<T>(coef * next[l].z, coef * next[l].w, hi.y, lo.y);
      *reinterpret_cast<uint2*>(hi_tile + Tiles::offset(tr, c4 * 4)) = hi;
      *reinterpret_cast<uint2*>(lo_tile + Tiles::offset(tr, c4 * 4)) = lo;
    }
    if (tid < 64) {
      const int srow = state_row(A, B, tid);
      z_of(buf)[tid] = zbase && srow >= 0 ? coef_of(A, B, tid) * zbase[srow] : 0.f;
    }
  };

  // out[row][col] accumulates in shared memory, each entry owned by one thread (the columns 8 B + 2 tq + j
  // of its rows), so that the loops over the tiles need not be unrolled to keep it in registers (255
  // registers and one CTA per SM when they were).
  float* outs = reinterpret_cast<float*>(rs + kRows);  // [kRows][kYS]
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    for (int col = 2 * tq; col < DH; col += 8) outs[row[hf] * kYS + col] = outs[row[hf] * kYS + col + 1] = 0.f;

  load_tile(0, 0);
  __syncthreads();  // every warp holds its x fragments: x's rows become tile buffer 1
  store_tile(0, 0, 0);
  Tiles::before_barrier();
  __syncthreads();
  if constexpr (kP == 1) {  // out = r M x + alpha z itself: one tile, no J_phi
    float u[8][4];
    Tiles::product_start(u, xa, ms, ml, lane);
    Tiles::product_finish(u);
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hf = i >> 1, tr = k * 8 + 2 * tq + (i & 1);  // the thread's own columns of out
        outs[row[hf] * kYS + tr] += fmaf(al_row[hf], zs[tr], r_row[hf] * u[k][i]);
      }
  } else {
    // The tiles (A, B >= A) in order, double-buffered with one barrier per tile: while the tensor
    // cores multiply tile (A, B) from buffer `buf`, the threads split the next tile (its loads went
    // out a tile earlier) into the other buffer, whose last reader finished before the previous
    // barrier; the barrier after the epilogue publishes it. With a barrier before and after each
    // tile's stores, barrier stalls were 22% of the samples (ncu, P1 t = 65536).
    auto after = [](int A, int B, int& nA, int& nB) {
      nA = B + 1 < kBlocks ? A : A + 1;
      nB = B + 1 < kBlocks ? B + 1 : A + 1;
    };
    int buf = 0;
    {
      int nA, nB;
      after(0, 0, nA, nB);
      load_tile(nA, nB);
    }
#pragma unroll 1
    for (int A = 0; A < kBlocks; ++A) {
      float part[8][2];  // partial out[row][8 A + k], this thread's columns only
#pragma unroll
      for (int k = 0; k < 8; ++k) part[k][0] = part[k][1] = 0.f;
#pragma unroll 1
      for (int B = A; B < kBlocks; ++B) {
        int nA, nB;
        after(A, B, nA, nB);
        float u[8][4];
        Tiles::product_start(u, xa, hi_of(buf), lo_of(buf), lane);
        if (nA < kBlocks) store_tile(nA, nB, buf ^ 1);
        Tiles::product_finish(u);
        if (nA < kBlocks) {
          Tiles::before_barrier();
          int n2A, n2B;
          after(nA, nB, n2A, n2B);
          if (n2A < kBlocks) load_tile(n2A, n2B);
        }
        const float* zt = z_of(buf);
        // y and out at [row][8 B + 2 tq + j], y at [row][8 A + k] four k at a time, z of the tile's
        // rows k * 8 + 2 tq + j.
        float2 yb[2], ob[2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) yb[hf] = *reinterpret_cast<const float2*>(ys + row[hf] * kYS + B * 8 + 2 * tq);
#pragma unroll
        for (int k4 = 0; k4 < 2; ++k4) {
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
              const float cu0 = fmaf(al_row[hf], zk.x, r_row[hf] * u[k][2 * hf]);
              const float cu1 = fmaf(al_row[hf], zk.y, r_row[hf] * u[k][2 * hf + 1]);
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
        __syncthreads();  // the next tile is stored, this one no longer read
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

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = row[hf];
    const bool in = r0 + r < len;  // every lane takes part in the quad's sum below
    const int64_t i = first + r0 + r, token_row = (batch * P.t + i) * P.H + head;
    const float w = rho[r];
    float dot = 0.f;
    for (int col = 2 * tq; col < DH; col += 8) {
      const float s0 = w * outs[r * kYS + col], s1 = w * outs[r * kYS + col + 1];
      dot = fmaf(ys[r * kYS + col], s0, fmaf(ys[r * kYS + col + 1], s1, dot));
      if (!in) continue;
      const float2 pairs = P.sum ? *reinterpret_cast<const float2*>(P.sum + token_row * DH + col) : float2{0.f, 0.f};
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
