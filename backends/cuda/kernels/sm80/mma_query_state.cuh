// query_state as expand-MMA on tensor cores (mma.sync, sm_80+): for the tokens i of chunk m,
//   num_i = phi(scale q_i)^T S_m exp(Gc_i),   den_i = phi(scale q_i)^T z_m exp(Gc_i),
// combined with the intra-chunk (y, l, rowmax) and normalized in the epilogue. A GEMM with
// M = tokens, N = e (+ one 8-wide tile holding z), K = D. The A operand phi(Q) is formed per
// fragment from the query tile in shared memory (pairs of consecutive phi rows, the p factors
// packed and multiplied as b16 pairs); phi's coefficients are folded into the state tile when it
// is converted from f32 to b16, and scale^p into the epilogue.
//
// CTA: 4 warps, 128 tokens of one chunk (32 per warp: two m16 tiles) x all e, over one query head.
// The K loop steps 32 rows of the state; the next rows are staged in registers meanwhile.
//
// kSplit (the tensor-core power_attention_backward's dv state term, phi(k_j)^T dY, which cancels where
// a query of large 1 / den_i nearly orthogonal to k_j dominates dY): phi(Q) is formed in f32 and both
// operands are split into b16 hi + lo, A_hi B_hi + A_lo B_hi + A_hi B_lo per product, as
// kernels/sm90/blocked_query_state.cuh does on Hopper.
#pragma once

#include "gpu/kernels/query_output.hpp"
#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

struct mma_query_state_params {
  const void* q;
  int64_t q_sb, q_st, q_sh;  // [b,t,hq,d], d contiguous
  const float* S;
  int64_t S_sb, S_sn, S_sh, S_sD;  // [b,n,h,D,e], e contiguous
  const float* z;                  // null unless normalized
  int64_t z_sb, z_sn, z_sh, z_sD;
  const float* y;  // null: no intra-chunk term
  int64_t y_sb, y_st, y_sh, y_se;
  const float* l;
  int64_t l_sb, l_st, l_sh;
  const float* rowmax;
  int64_t r_sb, r_st, r_sh;
  void* o;
  int64_t o_sb, o_st, o_sh, o_se;
  gates g;
  const phi_entry* table;
  phi_blocks blocks;          // for the blocked kernel only
  const float* state_scales;  // the F16 kernel: the states' column scales and f16 B tiles
  const __half* f16_tiles;    // (kernels/sm90/f16_state_tiles.cuh)
  int64_t tile_count;         // the F16 kernel: the tiles its CTAs take in turn
  int stage_y;                // the F16 kernel: the intra-chunk term goes through shared memory
  int ring;                   // the F16 kernel: B tiles in flight
  int64_t t, c, n, h, hq, D;
  int d, p, normalize, tok_tiles;
  float scale_p;  // scale^p
};

namespace mma_query_state_cfg {
constexpr int kWarps = 4, kThreads = 128;
constexpr int kTokens = 128;  // tokens per CTA
constexpr int kRowsK = 32;    // rows of the state per K step
constexpr int kMaxD = 256;
}  // namespace mma_query_state_cfg

template <class T, int E, bool kSplit = false>
constexpr size_t mma_query_state_smem(int d) {
  using namespace mma_query_state_cfg;
  return size_t(kTokens) * (d + 8) * sizeof(T) + (kSplit ? 4 : 2) * size_t(kRowsK) * (E + 8) * sizeof(T) +
         2 * size_t(kRowsK) * 4 * sizeof(int);
}

// The coordinates of a query-state tile: `tokens` query tokens of one chunk and query head; ntok <= 0
// when the tile lies past the chunk's end. Tile number `tile` (persistent kernels take theirs in turn),
// or the CTA's own (blockIdx.x).
struct query_tile {
  int64_t qh, chunk, batch, kv, bh;  // query head, chunk, batch, key/value head, batch * h + kv
  int64_t tok0, ntok;                // first token, tokens in the tile
};
__device__ __forceinline__ query_tile decode_query_tile(const mma_query_state_params& P, int tokens, int64_t tile) {
  const cta_coords at = decode_cta(P.tok_tiles, P.hq, P.n, tile);
  query_tile q;
  q.qh = at.head; q.chunk = at.chunk; q.batch = at.batch;
  q.kv = q.qh / (P.hq / P.h);
  q.bh = q.batch * P.h + q.kv;
  const int64_t chunk_first = q.chunk * P.c, chunk_len = min(P.c, P.t - chunk_first);
  q.tok0 = chunk_first + int64_t(at.tile) * tokens;
  q.ntok = min(int64_t(tokens), chunk_first + chunk_len - q.tok0);
  return q;
}
__device__ __forceinline__ query_tile decode_query_tile(const mma_query_state_params& P, int tokens) {
  return decode_query_tile(P, tokens, blockIdx.x);
}

// Writes token i's outputs from its raw accumulators (of an m16n8 layout: this lane has columns
// 8 nt + 2 tq + u; num(nt, u) returns them) and raw denominator: applies the decay exp(Gc_i) and
// scale^p, adds the intra-chunk term and normalizes (the factors once per token, then one
// multiply-add per output).
template <class T, int kNT, class Num>
__device__ __forceinline__ void store_query_output(const mma_query_state_params& P, T* obase, int64_t batch,
                                                   int64_t qh, int64_t bh, int64_t i, int tq, float den, Num num) {
  const float f = P.scale_p, g = P.g.Gc ? P.g.Gc[bh * P.t + i] : 0.f;
  float lv = 0.f, rm = 0.f;
  const bool intra = P.y != nullptr;
  if (intra) {
    rm = P.rowmax[batch * P.r_sb + i * P.r_st + qh * P.r_sh];
    if (P.l) lv = P.l[batch * P.l_sb + i * P.l_st + qh * P.l_sh];
  }
  const output_weights w = output_weights_of(den * f, g, intra, lv, rm, P.normalize != 0);
  const float wn = w.wn * f;
  T* out = obase + i * P.o_st;
  const float* yrow = intra ? P.y + batch * P.y_sb + i * P.y_st + qh * P.y_sh : nullptr;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int col = nt * 8 + 2 * tq + u;
      const float yv = intra ? yrow[col * P.y_se] : 0.f;
      out[col * P.o_se] = from_f32<T>((num(nt, u) * wn + yv * w.wy) * w.r);
    }
  }
}

template <class T, int E, bool kSplit = false>
__global__ void __launch_bounds__(128) mma_query_state_kernel(mma_query_state_params P) {
  using namespace mma_query_state_cfg;
  constexpr int kSS = E + 8;  // row stride of the state tile (e columns + the z tile)
  constexpr int kNT = E / 8;
  constexpr int kSVec = kRowsK * E / 4 / kThreads;  // float4 of S per thread per step
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = P.d, qs_stride = d + 8;
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kTokens][d+8]
  // Two buffers each, addressed by arithmetic (a run-time indexed pointer array would live in
  // local memory): the state rows [kRowsK][kSS] in b16 (kSplit: hi, then two buffers of lo) and
  // their q columns [kRowsK][4].
  T* const sb0 = qs + kTokens * qs_stride;
  constexpr int sb_size = kRowsK * kSS;
  [[maybe_unused]] T* const lo0 = sb0 + 2 * sb_size;
  int* const sidx0 = reinterpret_cast<int*>(sb0 + (kSplit ? 4 : 2) * sb_size);
  constexpr int sidx_size = kRowsK * 4;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const query_tile at = decode_query_tile(P, kTokens);
  if (at.ntok <= 0) return;
  const int64_t qh = at.qh, m = at.chunk, batch = at.batch, kv = at.kv, bh = at.bh, tok0 = at.tok0, ntok = at.ntok;

  // The query tile, once.
  const T* qbase = static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh;
  for (int vi = tid; vi < kTokens * d / 8; vi += kThreads) {
    const int s = vi / (d / 8), c8 = vi % (d / 8);
    const uint4 val = s < ntok ? *reinterpret_cast<const uint4*>(qbase + (tok0 + s) * P.q_st + c8 * 8) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(qs + s * qs_stride + c8 * 8) = val;
  }

  const float* Sbase = P.S + batch * P.S_sb + m * P.S_sn + kv * P.S_sh;
  const float* zbase = P.z ? P.z + batch * P.z_sb + m * P.z_sn + kv * P.z_sh : nullptr;
  float4 sreg[kSVec];
  float creg[kSVec];
  float zreg = 0.f, zcoef = 0.f;  // multiplied at the store: no arithmetic waits on loads early
  int ireg[4] = {0, 0, 0, 0};
  auto load_step = [&](int64_t r0) {
#pragma unroll
    for (int i = 0; i < kSVec; ++i) {
      const int vi = tid + i * kThreads, row = vi / (E / 4), c4 = vi % (E / 4);
      const int64_t r = r0 + row;
      sreg[i] = r < P.D ? *reinterpret_cast<const float4*>(Sbase + r * P.S_sD + c4 * 4) : make_float4(0, 0, 0, 0);
      creg[i] = r < P.D ? P.table[r].coef : 0.f;
    }
    if (tid < kRowsK) {
      const int64_t r = r0 + tid;
      if (r < P.D) {
        const phi_entry e = P.table[r];
        zreg = zbase ? zbase[r * P.z_sD] : 0.f;
        zcoef = e.coef;
#pragma unroll
        for (int k = 0; k < 4; ++k) ireg[k] = e.idx[k];
      } else {
        zreg = 0.f;
        zcoef = 0.f;
#pragma unroll
        for (int k = 0; k < 4; ++k) ireg[k] = 0;
      }
    }
  };
  auto store_step = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kSVec; ++i) {
      const int vi = tid + i * kThreads, row = vi / (E / 4), c4 = vi % (E / 4);
      const float cf = creg[i];
      uint2 packed;
      [[maybe_unused]] uint2 lo;
      if constexpr (kSplit) {
        split2_f32<T>(sreg[i].x * cf, sreg[i].y * cf, packed.x, lo.x);
        split2_f32<T>(sreg[i].z * cf, sreg[i].w * cf, packed.y, lo.y);
        *reinterpret_cast<uint2*>(lo0 + buf * sb_size + row * kSS + c4 * 4) = lo;
      } else {
        packed.x = pack2_f32<T>(sreg[i].x * cf, sreg[i].y * cf);
        packed.y = pack2_f32<T>(sreg[i].z * cf, sreg[i].w * cf);
      }
      *reinterpret_cast<uint2*>(sb0 + buf * sb_size + row * kSS + c4 * 4) = packed;
    }
    if (tid < kRowsK) {
      uint4 zr = make_uint4(0, 0, 0, 0);
      const float zv = zreg * zcoef;
      reinterpret_cast<T*>(&zr)[0] = from_f32<T>(zv);
      *reinterpret_cast<uint4*>(sb0 + buf * sb_size + tid * kSS + E) = zr;
      if constexpr (kSplit) {
        reinterpret_cast<T*>(&zr)[0] = from_f32<T>(zv - to_f32(reinterpret_cast<T*>(&zr)[0]));
        *reinterpret_cast<uint4*>(lo0 + buf * sb_size + tid * kSS + E) = zr;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) sidx0[buf * sidx_size + tid * 4 + k] = ireg[k];
    }
  };

  float acc[2][kNT + 1][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt <= kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  const bool want_z = P.normalize != 0;
  const int64_t steps = (P.D + kRowsK - 1) / kRowsK;
  load_step(0);
  store_step(0);
  __syncthreads();
  const T* qrow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) qrow[mt][hf] = qs + (warp * 32 + mt * 16 + hf * 8 + g) * qs_stride;

  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step & 1);
    if (step + 1 < steps) load_step((step + 1) * kRowsK);
    const T* bb = sb0 + buf * sb_size;
    [[maybe_unused]] const T* bl = lo0 + buf * sb_size;  // kSplit only
    const int* ib = sidx0 + buf * sidx_size;
#pragma unroll
    for (int ks = 0; ks < kRowsK / 16; ++ks) {
      // The q columns of the 4 phi rows (2tq, 2tq+1, 2tq+8, 2tq+9) this lane's fragments use.
      int cols[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = ks * 16 + 2 * tq + (j & 1) + (j >> 1) * 8;
        const int4 v = *reinterpret_cast<const int4*>(ib + r * 4);
        cols[j][0] = v.x; cols[j][1] = v.y; cols[j][2] = v.z; cols[j][3] = v.w;
      }
      uint32_t a[2][4];
      [[maybe_unused]] uint32_t a_lo[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const T* row = qrow[mt][q & 1];
          const int j0 = (q >> 1) * 2;  // phi rows j0 and j0+1 of cols[]
          uint32_t prod = pack2(row[cols[j0][0]], row[cols[j0 + 1][0]]);
          if constexpr (kSplit) {  // the product in f32, then hi + lo
            float2 x = unpack2_f32<T>(prod);
#pragma unroll
            for (int k = 1; k < 4; ++k)
              if (k < P.p) {
                const float2 y = unpack2_f32<T>(pack2(row[cols[j0][k]], row[cols[j0 + 1][k]]));
                x.x *= y.x, x.y *= y.y;
              }
            split2_f32<T>(x.x, x.y, a[mt][q], a_lo[mt][q]);
          } else {
#pragma unroll
            for (int k = 1; k < 4; ++k)
              if (k < P.p) prod = mul2<T>(prod, pack2(row[cols[j0][k]], row[cols[j0 + 1][k]]));
            a[mt][q] = prod;
          }
        }
      const int brow = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, bb + brow * kSS + np * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_16816<T>(acc[mt][2 * np], a[mt], b);
          mma_16816<T>(acc[mt][2 * np + 1], a[mt], b + 2);
        }
        if constexpr (kSplit) {
          uint32_t blo[4];
          ldmatrix_x4_trans(blo, bl + brow * kSS + np * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_16816<T>(acc[mt][2 * np], a_lo[mt], b);
            mma_16816<T>(acc[mt][2 * np + 1], a_lo[mt], b + 2);
            mma_16816<T>(acc[mt][2 * np], a[mt], blo);
            mma_16816<T>(acc[mt][2 * np + 1], a[mt], blo + 2);
          }
        }
      }
      if (want_z) {
        uint32_t b[2];
        ldmatrix_x2_trans(b, bb + brow * kSS + E);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_16816<T>(acc[mt][kNT], a[mt], b);
        if constexpr (kSplit) {
          uint32_t blo[2];
          ldmatrix_x2_trans(blo, bl + brow * kSS + E);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_16816<T>(acc[mt][kNT], a_lo[mt], b);
            mma_16816<T>(acc[mt][kNT], a[mt], blo);
          }
        }
      }
    }
    if (step + 1 < steps) store_step(buf ^ 1);
    __syncthreads();
  }

  // Epilogue: decay, scale^p, the intra-chunk term, normalization (den: column E, held by tq = 0).
  T* obase = static_cast<T*>(P.o) + batch * P.o_sb + qh * P.o_sh;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int local = warp * 32 + mt * 16 + hf * 8 + g;
      const float den = __shfl_sync(0xffffffffu, acc[mt][kNT][2 * hf], lane & ~3);
      if (local >= ntok) continue;
      store_query_output<T, kNT>(P, obase, batch, qh, bh, tok0 + local, tq, den,
                                 [&](int nt, int u) { return acc[mt][nt][2 * hf + u]; });
    }
}

}  // namespace expanse_cuda
