// The fused forward's state pass (power_attention at p = 2, d = e = 64, bf16; mma.sync, sm_80 and
// later; docs/fused.md): each head's state stays on chip for the whole sequence, split over CTAs,
// and only the inter-chunk outputs leave it.
//
// The state in phi blocks: the 36 pairs (ta <= tb) of 8-wide tiles of the key's 64 dims, each 64
// features (i, j) -> k[8 ta + i] k[8 tb + j]. A CTA (head, row part, column part) holds
// `blocks_per_cta` blocks, one per warp, for its NCOL value columns (and z, on column part 0, as one
// more 8-wide tile whose first column is the sum of the gated phi(k)): 64 x (NCOL + 8) f32 in each
// warp's accumulators. The accumulators hold S' = the state without its layout coefficients (the
// sum over keys of w_j k_a k_b v_j), so that the update's A operand is a bare product of two key
// entries, one packed multiply per pair of tokens; the coefficients come back, squared, when S' is
// converted for the query (c2: 2 off the diagonal, 1 on it, and in the diagonal blocks 0 below it for
// sympow, whose rows hold each pair once).
//
// Per chunk of kChunk tokens, in order:
//  1. the state entering the chunk, times c2 and a power of two per column (its largest entry under
//     2^12), is written to shared memory as f16 (11 bits: docs/spec.md's precision rules keep the
//     query's operands f16, see f16_state_tiles.cuh);
//  2. the chunk's keys (transposed) and gated values w_j v_j (and w_j for z) are staged in b16;
//  3. the query: each warp takes 16-token tiles of each query head of the group; phi(q) is formed in
//     registers from the query tile converted to f16 (each token times a power of two), times the
//     CTA's state tiles, by mma.sync; the partial num and den (scaled back exactly, times scale^2)
//     are added into f32 buffers in global memory, which R row parts share;
//  4. the update: S' = exp(A_m) S' + phi(K)^T (w v), each warp its own block.
// After the last chunk the final state is written in the layout asked for; an initial state seeds S'.
// The intra-chunk term and the combination into o are fused_output_kernel's, with the flash kernel's
// (y, l, rowmax) at the same chunk size.
#pragma once

#include "gpu/kernels/query_output.hpp"
#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

namespace fused_cfg {
constexpr int kDim = 64;          // d
constexpr int kTiles = kDim / 8;  // 8-wide tiles of the key
constexpr int kBlocks = kTiles * (kTiles + 1) / 2;
constexpr int kChunk = 128;       // tokens per step
constexpr int kKeyStride = kChunk + 16;  // b16 per row of the transposed keys: 72 words, 8 banks apart
constexpr int kRawStride = kDim + 8;     // b16 per row of the raw k and q tiles: 36 words, 4 banks apart
constexpr int kQueryStride = kDim + 8;  // f16 per row of the query tile
}  // namespace fused_cfg

struct fused_params {
  const void *q, *k, *v;  // b16, last dim contiguous
  int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh;
  gates g;
  float *num, *den;                  // [b, t, hq, e], [b, t, hq], zeroed (den: null without z)
  const float *S0, *z0;              // [b, h, D, e], [b, h, D] or null
  float *S_final, *z_final;          // likewise, or null
  int64_t t, n, h, hq, e, D;
  int sympow;                        // the state layout: sympow (1) or tiled with d_tile 8 (0)
  int blocks_per_cta, row_parts, col_parts;
  int need_z;
  float scale_p;                     // scale^2
};

// Block s in lexicographic order of (ta <= tb).
__device__ __forceinline__ void fused_block_pair(int s, int& ta, int& tb) {
  ta = 0;
  while (s >= fused_cfg::kTiles - ta) s -= fused_cfg::kTiles - ta, ++ta;
  tb = ta + s;
}

// c2 (the squared coefficient the query weighs S' by) and the state row of feature (i, j) of block
// (ta, tb) in the layout; row -1 where the layout has no such row (sympow below the diagonal).
struct fused_feature {
  float c2;
  int64_t row;
};
__device__ __forceinline__ fused_feature fused_feature_of(int blk, int ta, int tb, int i, int j, int sympow) {
  if (!sympow) return {ta == tb ? 1.f : 2.f, int64_t(blk) * 64 + i * 8 + j};
  const int a = 8 * ta + i, b = 8 * tb + j;
  if (a > b) return {0.f, -1};
  return {a == b ? 1.f : 2.f, sympow2_row<int64_t>(fused_cfg::kDim, a, b)};
}

// The power of two that takes x (>= 0) under 2^top (0 for x = 0), clamped to float's range.
__device__ __forceinline__ int scale_exponent(float x, int top) {
  if (!(x > 0.f)) return 0;
  int e;
  frexpf(x, &e);  // x < 2^e
  return max(-100, min(100, top - e));
}

// Two f32 added to consecutive floats of global memory (one vector atomic on sm_90).
__device__ __forceinline__ void add_pair(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

template <int NCOL, int WB>
struct fused_smem {
  static constexpr int kColsZ = NCOL + 8;             // the state's columns: values, then the z tile
  static constexpr int kStateStride = WB * 64 + 8;    // f16 per column of the state tiles
  static constexpr size_t keys = size_t(fused_cfg::kDim) * fused_cfg::kKeyStride * 2;
  static constexpr size_t values = size_t(fused_cfg::kChunk) * kColsZ * 2;
  static constexpr size_t query = size_t(fused_cfg::kChunk) * fused_cfg::kQueryStride * 2;
  static constexpr size_t state = size_t(kColsZ) * kStateStride * 2;
  static constexpr size_t scales = size_t(fused_cfg::kChunk + 2 * kColsZ) * 4;
  // the next chunk's inputs as they are in memory (k, the CTA's v columns, the group's first q head,
  // the keys' gate sums), copied by cp.async while this chunk computes
  static constexpr size_t raw_k = size_t(fused_cfg::kChunk) * fused_cfg::kRawStride * 2;
  static constexpr size_t raw_v = size_t(fused_cfg::kChunk) * NCOL * 2;
  static constexpr size_t raw_g = size_t(fused_cfg::kChunk) * 4;
  static constexpr size_t bytes = keys + values + query + state + scales + 2 * raw_k + raw_v + raw_g;
};

template <int NCOL, int WB>
__global__ void __launch_bounds__(WB * 32) fused_state_pass_kernel(fused_params P) {
  using namespace fused_cfg;
  using T = __nv_bfloat16;
  using L = fused_smem<NCOL, WB>;
  constexpr int NT = NCOL / 8 + 1;  // n-tiles of the state: NCOL / 8 of values, then z
  constexpr int kThreads = WB * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* keys = reinterpret_cast<T*>(smem);                                  // [kDim][kKeyStride]: k transposed
  T* values = reinterpret_cast<T*>(smem + L::keys);                      // [kChunk][kColsZ]: w v, w
  __half* query = reinterpret_cast<__half*>(smem + L::keys + L::values);  // [kChunk][kQueryStride]
  __half* state = reinterpret_cast<__half*>(smem + L::keys + L::values + L::query);  // [kColsZ][kStateStride]
  int* row_exp = reinterpret_cast<int*>(smem + L::keys + L::values + L::query + L::state);  // [kChunk]
  int* col_exp = row_exp + kChunk;                                               // [kColsZ]
  unsigned* col_max = reinterpret_cast<unsigned*>(col_exp + L::kColsZ);          // [kColsZ]
  unsigned char* raw = smem + L::keys + L::values + L::query + L::state + L::scales;
  T* raw_k = reinterpret_cast<T*>(raw);                                  // [kChunk][kRawStride]
  T* raw_q = reinterpret_cast<T*>(raw + L::raw_k);                       // [kChunk][kRawStride]
  T* raw_v = reinterpret_cast<T*>(raw + 2 * L::raw_k);                   // [kChunk][NCOL]
  float* raw_g = reinterpret_cast<float*>(raw + 2 * L::raw_k + L::raw_v);  // [kChunk]: key_Gc

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;
  int64_t cta = blockIdx.x;
  const int cp = int(cta % P.col_parts);
  cta /= P.col_parts;
  const int rp = int(cta % P.row_parts);
  const int64_t bh = cta / P.row_parts, batch = bh / P.h, kv = bh % P.h, group = P.hq / P.h;
  const int blk0 = rp * P.blocks_per_cta, nblk = min(P.blocks_per_cta, kBlocks - blk0);
  const int col0 = cp * NCOL;
  const bool has_z = P.need_z && cp == 0;
  const bool holds = warp < nblk;
  int ta = 0, tb = 0;
  if (holds) fused_block_pair(blk0 + warp, ta, tb);
  float c2[4][2];  // of this thread's features (i = 2 mt + h2, j = g8)
  for (int mt = 0; mt < 4; ++mt)
    for (int h2 = 0; h2 < 2; ++h2) c2[mt][h2] = fused_feature_of(blk0 + warp, ta, tb, 2 * mt + h2, g8, P.sympow).c2;

  // This thread's entries of its warp's block: element x of C fragment [mt][nt] is feature
  // (i = 2 mt + x / 2, j = g8) and column nt * 8 + 2 t4 + x % 2.
  float S[4][NT][4];
  for (int mt = 0; mt < 4; ++mt)
    for (int nt = 0; nt < NT; ++nt)
      for (int x = 0; x < 4; ++x) {
        float s = 0.f;
        const int col = nt * 8 + 2 * t4 + x % 2;
        if (holds && P.S0 && (nt < NT - 1 || (has_z && col == NCOL))) {
          const fused_feature f = fused_feature_of(blk0 + warp, ta, tb, 2 * mt + x / 2, g8, P.sympow);
          if (f.row >= 0) {
            const float coef = sqrtf(f.c2);
            s = nt < NT - 1 ? P.S0[(bh * P.D + f.row) * P.e + col0 + col] / coef
                            : (P.z0 ? P.z0[bh * P.D + f.row] / coef : 0.f);
          }
        }
        S[mt][nt][x] = s;
      }

  const gates kg = P.g.keys();
  // Issues the copies of chunk mm's inputs into the raw buffers (zeros past the end).
  auto prefetch = [&](int64_t mm) {
    const int64_t f = mm * kChunk;
    const int ln = int(min(int64_t(kChunk), P.t - f));
    for (int idx = threadIdx.x; idx < kChunk * (kDim / 8); idx += kThreads) {
      const int tok = idx / (kDim / 8), piece = idx % (kDim / 8);
      const bool ok = tok < ln;
      const int64_t tk = ok ? f + tok : 0;
      copy_async<16>(raw_k + tok * kRawStride + piece * 8,
                     static_cast<const T*>(P.k) + batch * P.k_sb + tk * P.k_st + kv * P.k_sh + piece * 8, ok);
      copy_async<16>(raw_q + tok * kRawStride + piece * 8,
                     static_cast<const T*>(P.q) + batch * P.q_sb + tk * P.q_st + kv * group * P.q_sh + piece * 8, ok);
    }
    for (int idx = threadIdx.x; idx < kChunk * (NCOL / 8); idx += kThreads) {
      const int tok = idx / (NCOL / 8), piece = idx % (NCOL / 8);
      const bool ok = tok < ln;
      copy_async<16>(raw_v + tok * NCOL + piece * 8,
                     static_cast<const T*>(P.v) + batch * P.v_sb + (ok ? f + tok : 0) * P.v_st + kv * P.v_sh + col0 + piece * 8, ok);
    }
    if (kg.Gc)
      for (int tok = threadIdx.x; tok < kChunk; tok += kThreads)
        copy_async<4>(raw_g + tok, kg.Gc + bh * P.t + (tok < ln ? f + tok : 0), tok < ln);
    copy_async_commit();
  };
  // The query tile in f16, each row times the power of two that takes its largest entry under 2^7
  // (products under 2^14); two threads (neighbouring lanes) per row, each 32 entries; whole warps
  // take part, as kThreads and 2 kChunk are multiples of 32. piece_of(tok, piece): 8 b16 as uint4.
  auto convert_query_rows = [&](auto piece_of) {
    for (int item = threadIdx.x; item < 2 * kChunk; item += kThreads) {
      const int tok = item / 2, half = item % 2;
      float x[kDim / 2];
      float mx = 0.f;
      for (int piece = 0; piece < kDim / 16; ++piece) {
        const uint4 raw4 = piece_of(tok, half * (kDim / 16) + piece);
        const uint32_t words[4] = {raw4.x, raw4.y, raw4.z, raw4.w};
        for (int w = 0; w < 4; ++w) {
          const float2 f = unpack2_f32<T>(words[w]);
          x[piece * 8 + 2 * w] = f.x, x[piece * 8 + 2 * w + 1] = f.y;
          mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the row's other half (the next lane)
      const int ex = scale_exponent(mx, 7);
      if (half == 0) row_exp[tok] = ex;
      const float sc = pow2_of(ex);
      for (int piece = 0; piece < kDim / 16; ++piece) {
        uint32_t out[4];
        for (int w = 0; w < 4; ++w) out[w] = pack2_f32<__half>(x[piece * 8 + 2 * w] * sc, x[piece * 8 + 2 * w + 1] * sc);
        *reinterpret_cast<uint4*>(query + tok * kQueryStride + (half * (kDim / 16) + piece) * 8) =
            make_uint4(out[0], out[1], out[2], out[3]);
      }
    }
  };
  prefetch(0);

  for (int64_t m = 0; m < P.n; ++m) {
    const int64_t first = m * kChunk;
    const int len = int(min(int64_t(kChunk), P.t - first));
    const bool query_state = m > 0 || P.S0;
    const float key_total = kg.total ? kg.total[bh * P.n + m] : 0.f;
    const float decay = __expf(P.g.chunk_total(bh, P.n, m));  // exp(A_m); 0 after a reset in the chunk
    __syncthreads();  // the previous chunk's readers of every buffer are done
    if (query_state) {
      // 1. The state entering the chunk as f16 tiles: c2 S' times its column's power of two.
      for (int c = threadIdx.x; c < L::kColsZ; c += kThreads) col_max[c] = 0u;
      __syncthreads();
      if (holds) {
        for (int nt = 0; nt < NT; ++nt)
          for (int x = 0; x < 2; ++x) {
            float mx = 0.f;
            for (int mt = 0; mt < 4; ++mt)
              for (int h2 = 0; h2 < 2; ++h2)
                mx = fmaxf(mx, fabsf(c2[mt][h2] * S[mt][nt][2 * h2 + x]));
            for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            if (g8 == 0) atomicMax(&col_max[nt * 8 + 2 * t4 + x], __float_as_uint(mx));
          }
      }
      __syncthreads();
      for (int c = threadIdx.x; c < L::kColsZ; c += kThreads) col_exp[c] = scale_exponent(__uint_as_float(col_max[c]), 12);
      __syncthreads();
      if (holds) {
        for (int mt = 0; mt < 4; ++mt)
          for (int nt = 0; nt < NT; ++nt)
            for (int x = 0; x < 4; ++x) {
              const int i = 2 * mt + x / 2, col = nt * 8 + 2 * t4 + x % 2;
              state[col * L::kStateStride + warp * 64 + i * 8 + g8] = __float2half_rn(c2[mt][x / 2] * S[mt][nt][x] * pow2_of(col_exp[col]));
            }
      }
    }
    // 2. From the raw copies: the keys transposed, the gated values (w_j = exp(A_m - Gc_j), 0 past
    // the end; w_j itself for z) and the first query head's tile.
    copy_async_wait<0>();
    __syncthreads();
    // The keys transposed: each 8 x 8 (tokens x dims) matrix by a transposing ldmatrix (a lane then
    // holds tokens 2 t4, 2 t4 + 1 of dim g8), four matrices per instruction, stored as b16 pairs.
    for (int quad = warp; quad < kChunk / 8 * kTiles / 4; quad += WB) {
      const int mat = quad * 4 + lane / 8, tg = mat / kTiles, dt = mat % kTiles;
      uint32_t r[4];
      ldmatrix_x4_trans(r, raw_k + (tg * 8 + lane % 8) * kRawStride + dt * 8);
      for (int x = 0; x < 4; ++x) {
        const int mx = quad * 4 + x, tgx = mx / kTiles, dtx = mx % kTiles;
        *reinterpret_cast<uint32_t*>(keys + (dtx * 8 + g8) * kKeyStride + tgx * 8 + 2 * t4) = r[x];
      }
    }
    for (int idx = threadIdx.x; idx < kChunk * (L::kColsZ / 8); idx += kThreads) {
      const int tok = idx / (L::kColsZ / 8), piece = idx % (L::kColsZ / 8);
      const float w = tok >= len ? 0.f : kg.Gc ? __expf(key_total - raw_g[tok]) : 1.f;
      uint32_t out[4] = {0, 0, 0, 0};
      if (piece < NCOL / 8) {
        const uint4 raw4 = load_shared_16(raw_v + tok * NCOL + piece * 8);
        const uint32_t words[4] = {raw4.x, raw4.y, raw4.z, raw4.w};
        for (int x = 0; x < 4; ++x) {
          const float2 f = unpack2_f32<T>(words[x]);
          out[x] = pack2_f32<T>(w * f.x, w * f.y);
        }
      } else if (has_z) {
        out[0] = pack2_f32<T>(w, 0.f);
      }
      *reinterpret_cast<uint4*>(values + tok * L::kColsZ + piece * 8) = make_uint4(out[0], out[1], out[2], out[3]);
    }
    if (query_state)
      convert_query_rows([&](int tok, int piece) { return load_shared_16(raw_q + tok * kRawStride + piece * 8); });
    __syncthreads();  // the raw buffers are read: the next chunk's copies may start
    if (m + 1 < P.n) prefetch(m + 1);

    // 3. The query of the state entering the chunk, by each query head of the group (the first one's
    // tile is ready; the others' are read from global memory here).
    for (int64_t qh = kv * group; query_state && qh < (kv + 1) * group; ++qh) {
      if (qh > kv * group) {
        __syncthreads();  // the previous head's query tile is read
        convert_query_rows([&](int tok, int piece) {
          return tok < len ? *reinterpret_cast<const uint4*>(static_cast<const T*>(P.q) + batch * P.q_sb + (first + tok) * P.q_st +
                                                             qh * P.q_sh + piece * 8)
                           : make_uint4(0, 0, 0, 0);
        });
        __syncthreads();
      }
      for (int tile = warp; tile * 16 < len; tile += WB) {
        const int r0 = tile * 16 + g8, r1 = r0 + 8;
        // Two sums, by even and odd blocks: chains of dependent mma half as long.
        float acc[2][NT][4];
        for (int u = 0; u < 2; ++u)
          for (int nt = 0; nt < NT; ++nt)
            for (int x = 0; x < 4; ++x) acc[u][nt][x] = 0.f;
        // A block's 4 K steps: its state fragments first (the loads are asm volatile, so they keep
        // their place in the program: issued before the products, they land while phi(q) forms).
        auto add_block = [&](int blk, float (&sum)[NT][4]) {
          constexpr int NP = (NT + 1) / 2;  // pairs of n-tiles (the last odd tile reads its own rows twice)
          const int mi = lane / 8;
          uint32_t b[4][NP][4];
#pragma unroll
          for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int np = 0; np < NP; ++np)
              ldmatrix_x4(b[s][np], state + (min(2 * np + mi / 2, NT - 1) * 8 + lane % 8) * L::kStateStride + blk * 64 +
                                        16 * s + (mi % 2) * 8);
          int qa, qb;
          fused_block_pair(blk0 + blk, qa, qb);
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(query + r0 * kQueryStride + 8 * qb + 2 * t4);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(query + r1 * kQueryStride + 8 * qb + 2 * t4);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const uint32_t a0w = *reinterpret_cast<const uint32_t*>(query + r0 * kQueryStride + 8 * qa + 2 * s);
            const uint32_t a1w = *reinterpret_cast<const uint32_t*>(query + r1 * kQueryStride + 8 * qa + 2 * s);
            const uint32_t a[4] = {mul2<__half>(b16_twice(a0w, 0), b0), mul2<__half>(b16_twice(a1w, 0), b1),
                                   mul2<__half>(b16_twice(a0w, 1), b0), mul2<__half>(b16_twice(a1w, 1), b1)};
#pragma unroll
            for (int np = 0; np < NP; ++np) {
              const int nt = 2 * np;
              if (nt < NT - 1 || has_z) mma_16816<__half>(sum[nt], a, b[s][np]);
              if (nt + 1 < NT && (nt + 1 < NT - 1 || has_z)) mma_16816<__half>(sum[nt + 1], a, b[s][np] + 2);
            }
          }
        };
        for (int blk = 0; blk < nblk; blk += 2) {
          add_block(blk, acc[0]);
          if (blk + 1 < nblk) add_block(blk + 1, acc[1]);
        }
        // num and den, scaled back exactly (2^-(2 row_exp + col_exp); ldexpf only where that is past
        // a float's exponent range), times scale^2.
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = h2 ? r1 : r0;
          if (r >= len) continue;
          const int64_t row = (batch * P.t + first + r) * P.hq + qh;
          auto scaled = [&](int nt, int x, int col) {
            const int ex = -2 * row_exp[r] - col_exp[col];
            const float v = (acc[0][nt][x] + acc[1][nt][x]) * P.scale_p;
            return ex >= -126 && ex <= 126 ? v * pow2_of(ex) : ldexpf(v, ex);
          };
          for (int nt = 0; nt < NT - 1; ++nt) {
            const int col = nt * 8 + 2 * t4;
            add_pair(P.num + row * P.e + col0 + col, scaled(nt, 2 * h2, col), scaled(nt, 2 * h2 + 1, col + 1));
          }
          if (has_z && t4 == 0) atomicAdd(P.den + row, scaled(NT - 1, 2 * h2, NCOL));
        }
      }
    }

    // 4. The update: S' = exp(A_m) S' + phi(K)^T (w v), each warp its own block.
    if (holds) {
      for (int mt = 0; mt < 4; ++mt)
        for (int nt = 0; nt < NT; ++nt)
          for (int x = 0; x < 4; ++x) S[mt][nt][x] *= decay;
#pragma unroll 2
      for (int ks = 0; ks * 16 < len; ++ks) {
        // tokens of this thread's k columns 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9: 16 ks + 4 t4 + 0..3.
        // B rows: logical k row kr of matrix mi is token 16 ks + 4 (kr / 2) + kr % 2 (+ 2 for the
        // second half). The B fragments are loaded first (asm volatile keeps them there), so that
        // they land while phi(K) forms.
        constexpr int NP = (NT + 1) / 2;
        const int mi = lane / 8, r = lane % 8;
        const int brow = 16 * ks + 4 * (r / 2) + r % 2 + (mi % 2) * 2;
        uint32_t b[NP][4];
#pragma unroll
        for (int np = 0; np < NP; ++np) ldmatrix_x4_trans(b[np], values + brow * L::kColsZ + min(2 * np + mi / 2, NT - 1) * 8);
        const int tok = 16 * ks + 4 * t4;
        const uint2 kb = *reinterpret_cast<const uint2*>(keys + (8 * tb + g8) * kKeyStride + tok);
        uint2 ka[8];
        for (int i = 0; i < 8; ++i) ka[i] = *reinterpret_cast<const uint2*>(keys + (8 * ta + i) * kKeyStride + tok);
        uint32_t a[4][4];
        for (int mt = 0; mt < 4; ++mt) {
          a[mt][0] = mul2<T>(ka[2 * mt].x, kb.x), a[mt][1] = mul2<T>(ka[2 * mt + 1].x, kb.x);
          a[mt][2] = mul2<T>(ka[2 * mt].y, kb.y), a[mt][3] = mul2<T>(ka[2 * mt + 1].y, kb.y);
        }
#pragma unroll
        for (int np = 0; np < NP; ++np) {
          const int nt = 2 * np;
          for (int mt = 0; mt < 4; ++mt) {
            if (nt < NT - 1 || has_z) mma_16816<T>(S[mt][nt], a[mt], b[np]);
            if (nt + 1 < NT && (nt + 1 < NT - 1 || has_z)) mma_16816<T>(S[mt][nt + 1], a[mt], b[np] + 2);
          }
        }
      }
    }
  }

  // The final state, with the layout's coefficients.
  if (holds && (P.S_final || P.z_final)) {
    for (int mt = 0; mt < 4; ++mt)
      for (int nt = 0; nt < NT; ++nt)
        for (int x = 0; x < 4; ++x) {
          const fused_feature f = fused_feature_of(blk0 + warp, ta, tb, 2 * mt + x / 2, g8, P.sympow);
          if (f.row < 0) continue;
          const int col = nt * 8 + 2 * t4 + x % 2;
          const float s = sqrtf(f.c2) * S[mt][nt][x];
          if (nt < NT - 1) {
            if (P.S_final) P.S_final[(bh * P.D + f.row) * P.e + col0 + col] = s;
          } else if (has_z && col == NCOL && P.z_final) {
            P.z_final[bh * P.D + f.row] = s;
          }
        }
  }
}

// o from the state pass's num, den and the intra-chunk (y, l, rowmax), one thread per output entry.
struct fused_output_params {
  const float *num, *den, *y, *l, *rowmax;  // [b, t, hq, e] / [b, t, hq], contiguous
  void* o;
  int64_t o_sb, o_st, o_sh;
  gates g;
  int64_t b, t, h, hq, e;
  int normalize;
};

template <class T>
__global__ void fused_output_kernel(fused_output_params P) {
  const int64_t total = P.b * P.t * P.hq * P.e;
  EXPANSE_GRID_LOOP(idx, total) {
    const int64_t row = quotient(idx, P.e), col = idx - row * P.e;
    const token_row at = split_row(row, P.t, P.hq);
    const int64_t qh = at.head, tok = at.tok, batch = at.batch, bh = batch * P.h + quotient(qh, P.hq / P.h);
    const float o = combine_output(P.num[idx], P.den ? P.den[row] : 0.f, P.g.cum(bh, P.t, tok), true, P.y[idx], P.l[row],
                                   P.rowmax[row], P.normalize != 0);
    static_cast<T*>(P.o)[batch * P.o_sb + tok * P.o_st + qh * P.o_sh + col] = from_f32<T>(o);
  }
}

}  // namespace expanse_cuda
