// Intra-chunk power attention, flash style on tensor cores (mma.sync, sm_80+). For each query row
// the scores are kept in log space (base 2):
//   s_ij = p log2|scale q_i . k_j| + (Gc_i - Gc_j) log2(e)        (-inf where masked or the dot is 0)
// with Gc_i - Gc_j taken of the sums restarted at resets, and keys before the row's last reset masked
// (their decay is exactly 0, docs/spec.md)
// with a running row maximum m_i, so that P_ij = sign_ij 2^(s_ij - m_i) never overflows, even for
// p = 4 on long chunks. Outputs are the stabilized y = sum_j P_ij v_j, l = sum_j P_ij and
// rowmax = m_i ln 2 (docs/spec.md, intra-chunk attention).
//
// CTA: 4 warps, 64 query rows of one chunk (16 per warp) against key blocks of 64, causal. The next
// key block is staged in registers while the current one is multiplied. kValues = false: l and rowmax
// alone (the backward's denominators), without the values, P V or y: half the products.
#pragma once

#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

struct flash_params {
  const void* q;
  const void* k;
  const void* v;
  int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh;  // last dims contiguous
  float* y;
  int64_t y_sb, y_st, y_sh, y_se;
  float* l;
  int64_t l_sb, l_st, l_sh;
  float* rowmax;
  int64_t r_sb, r_st, r_sh;
  gates g;
  int64_t t, c, n, h, hq;
  int p, q_tiles;
  int64_t group;  // chunk-heads per group of the CTA order (decode_cta_by_rank)
  float scale;
};

// The CTA's chunk, head and query tile: the tiles with the most key blocks (the last) first, within
// groups of chunk-heads whose keys and values stay in L2 (P.group). In plain order the longest tiles
// of the last heads started last.
__device__ __forceinline__ cta_coords flash_cta(const flash_params& P) {
  cta_coords at = decode_cta_by_rank(P.q_tiles, P.hq, P.n, P.group);
  at.tile = P.q_tiles - 1 - at.tile;
  return at;
}

namespace flash_cfg {
constexpr int kThreads = 128, kRows = 64, kKeys = 64;
}

template <class T, int DH, int E, bool kValues = true>
constexpr size_t flash_smem() {
  using namespace flash_cfg;
  return (size_t(kRows) * (DH + 8) + size_t(kKeys) * (DH + 8) + (kValues ? size_t(kKeys) * (E + 8) : 0)) * sizeof(T) +
         (kRows + kKeys) * sizeof(float) + kRows * sizeof(int);
}

// The CTA's 64 query rows into qs (zeros past the chunk): [64][DH + 8], padded for ldmatrix, or with
// kSwizzled rows of 128 bytes at the hardware's 128-byte swizzle (a K-major wgmma operand; DH = 64,
// 1024-byte aligned qs). Their restarted Gc in base 2 plus p log2|scale| (log2|scale q.k| =
// log2|scale| + log2|q.k|) less p 24 (the offset of log2_abs_offset) into gq, and their first keys
// into fk (tid: the thread of 128).
template <class T, int DH, bool kSwizzled = false>
__device__ __forceinline__ void flash_load_queries(const flash_params& P, const T* qbase, int64_t first, int64_t len,
                                                   int q0, int64_t bh, int tid, T* qs, float* gq, int* fk) {
  constexpr int kRows = flash_cfg::kRows, kQS = DH + 8;
  for (int vi = tid; vi < kRows * DH / 8; vi += flash_cfg::kThreads) {
    const int s = vi / (DH / 8), c8 = vi % (DH / 8);
    const uint4 val = q0 + s < len ? *reinterpret_cast<const uint4*>(qbase + (first + q0 + s) * P.q_st + c8 * 8)
                                   : make_uint4(0, 0, 0, 0);
    if constexpr (kSwizzled) {
      static_assert(DH * sizeof(T) == 128, "swizzled rows are 128 bytes");
      *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(qs) + swizzled_row_offset(s, c8, 128)) = val;
    } else {
      *reinterpret_cast<uint4*>(qs + s * kQS + c8 * 8) = val;
    }
  }
  const float p_log2_scale = P.p * (__log2f(fabsf(P.scale)) - kLog2AbsOffset);
  if (tid < kRows) {
    gq[tid] = (q0 + tid < len ? P.g.since_reset(bh, P.t, first + q0 + tid) * kLog2e : 0.f) + p_log2_scale;
    fk[tid] = q0 + tid < len ? P.g.first_key(bh, P.t, first + q0 + tid) : 0;
  }
}

// A warp's view of its 16 query rows (rows g and g + 8 of the m16 tile for this thread), for the
// terms between the two products of a key block.
struct flash_rows {
  int q0;                  // the CTA's first query row, local to the chunk
  int local[2];            // this thread's two rows, local to the chunk
  float g[2];              // their restarted Gc in base 2, plus p (log2|scale| - kLog2AbsOffset)
  const int* first_key;    // the CTA's rows' first keys (shared memory), read in masked blocks only
  int warp_first_key;      // the latest first key of the warp's 16 rows
  int warp_row0;           // the warp's first row within the CTA's
};

// Warp `warp`'s rows (g: this lane's row in the m16 tile) of a CTA whose 64 rows start at q0, from the
// rows' Gc (gq) and first keys (fk) in shared memory.
__device__ __forceinline__ flash_rows warp_rows(int q0, int warp, int g, const float* gq, const int* fk) {
  flash_rows r;
  r.q0 = q0, r.warp_row0 = warp * 16;
  r.local[0] = q0 + warp * 16 + g, r.local[1] = q0 + warp * 16 + g + 8;
  r.g[0] = gq[warp * 16 + g], r.g[1] = gq[warp * 16 + g + 8];
  r.first_key = fk;
  int wfk = max(fk[warp * 16 + g], fk[warp * 16 + g + 8]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) wfk = max(wfk, __shfl_xor_sync(0xffffffffu, wfk, o));
  r.warp_first_key = wfk;
  return r;
}

// The terms of one block of 64 keys, shared by the mma.sync and the wgmma kernel (their accumulators
// share a layout: warp w, rows 16 w + g and + 8, columns 8 nt + 2 tq, + 1): s holds Q K^T on entry,
// gk the keys' restarted Gc (natural log, as the gate sums hold it: copied, not converted).
// Log-space scores, masks and signs, the new row maxima (m) and the sums (l), and the weights P =
// sign 2^(s - m) in s on return; alpha is the rescale of what was summed before (flash_rescale_pack).
// The output accumulator is not touched: the wgmma kernel runs this while the previous block's
// P V is in flight.
__device__ __forceinline__ void flash_block_weights(const flash_params& P, const flash_rows& rows, const float* gk,
                                                    int key0, int64_t len, int g, int tq, float (&s)[8][4],
                                                    float (&mrow)[2], float (&lrow)[2], float (&alpha)[2]) {
  constexpr int kKeys = flash_cfg::kKeys;
  // A zero dot gives log2 0 = -inf, the same as a masked key; blocks wholly below the diagonal and
  // inside the chunk (all but the last one or two of a row tile) skip the per-score mask, and even p
  // (no sign to keep) skips the signs: each is a version of the loops of its own.
  const bool odd = P.p & 1, scale_negative = P.scale < 0.f;
  uint32_t negative = 0;
  float bmax[2] = {-INFINITY, -INFINITY};
  const bool unmasked = key0 + kKeys - 1 <= rows.q0 + rows.warp_row0 && key0 + kKeys <= len && key0 >= rows.warp_first_key;
  auto scores = [&](auto masked, auto signed_p) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hf = i >> 1, j = nt * 8 + 2 * tq + (i & 1);
        const float dot = s[nt][i];
        float sc = fmaf(float(P.p), log2_abs_offset(dot), fmaf(-kLog2e, gk[j], rows.g[hf]));
        if (masked && !(key0 + j <= rows.local[hf] && key0 + j < len &&
                        key0 + j >= rows.first_key[rows.warp_row0 + g + 8 * hf]))
          sc = -INFINITY;
        if (signed_p && (dot < 0.f) != scale_negative) negative |= 1u << (nt * 4 + i);
        s[nt][i] = sc;
        bmax[hf] = fmaxf(bmax[hf], sc);
      }
  };
  if (unmasked && !odd) scores(std::false_type{}, std::false_type{});
  else if (unmasked) scores(std::false_type{}, std::true_type{});
  else if (!odd) scores(std::true_type{}, std::false_type{});
  else scores(std::true_type{}, std::true_type{});
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    bmax[hf] = fmaxf(bmax[hf], __shfl_xor_sync(0xffffffffu, bmax[hf], 1));
    bmax[hf] = fmaxf(bmax[hf], __shfl_xor_sync(0xffffffffu, bmax[hf], 2));
    const float mnew = fmaxf(mrow[hf], bmax[hf]);
    alpha[hf] = mnew == -INFINITY ? 1.f : fast_exp2(mrow[hf] - mnew);  // exp2(-inf) = 0
    mrow[hf] = mnew;
    lrow[hf] *= alpha[hf];
  }
  // P = sign 2^(s - m): 2^(-inf - m) = 0 for masked scores while m is finite; a row with no score
  // yet uses m = 0.
  const float msub[2] = {mrow[0] == -INFINITY ? 0.f : mrow[0], mrow[1] == -INFINITY ? 0.f : mrow[1]};
  auto weights = [&](auto signed_p) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hf = i >> 1;
        float w = fast_exp2(s[nt][i] - msub[hf]);
        if (signed_p && (negative & (1u << (nt * 4 + i)))) w = -w;
        lrow[hf] += w;
        s[nt][i] = w;
      }
  };
  if (odd) weights(std::true_type{});
  else weights(std::false_type{});
}

// The output's rescale by the block's alpha and its weights w (flash_block_weights) packed as A
// fragments for P V.
template <class T, int kNT>
__device__ __forceinline__ void flash_rescale_pack(const float (&alpha)[2], const float (&w)[8][4], float (&acc)[kNT][4],
                                                   uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] *= alpha[i >> 1];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    pa[nt >> 1][(nt & 1) * 2 + 0] = pack2_f32<T>(w[nt][0], w[nt][1]);
    pa[nt >> 1][(nt & 1) * 2 + 1] = pack2_f32<T>(w[nt][2], w[nt][3]);
  }
}

// The outputs of this thread's two rows: y (kValues), l and rowmax, after the quad's row sums.
template <bool kValues, int kNT>
__device__ __forceinline__ void flash_store_rows(const flash_params& P, const flash_rows& rows, int64_t batch, int64_t qh,
                                                 int64_t first, int64_t len, int tq, const float (&mrow)[2],
                                                 float (&lrow)[2], const float (&acc)[kNT][4]) {
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    lrow[hf] += __shfl_xor_sync(0xffffffffu, lrow[hf], 1);
    lrow[hf] += __shfl_xor_sync(0xffffffffu, lrow[hf], 2);
    const int local = rows.local[hf];
    if (local >= len) continue;
    const int64_t i = first + local;
    const bool empty = mrow[hf] == -INFINITY;
    if constexpr (kValues) {
      float* yrow = P.y + batch * P.y_sb + i * P.y_st + qh * P.y_sh;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int col = nt * 8 + 2 * tq;
        yrow[col * P.y_se] = empty ? 0.f : acc[nt][2 * hf];
        yrow[(col + 1) * P.y_se] = empty ? 0.f : acc[nt][2 * hf + 1];
      }
    }
    if (tq == 0) {
      if (P.l) P.l[batch * P.l_sb + i * P.l_st + qh * P.l_sh] = empty ? 0.f : lrow[hf];
      if (P.rowmax) P.rowmax[batch * P.r_sb + i * P.r_st + qh * P.r_sh] = empty ? 0.f : mrow[hf] * kLn2;
    }
  }
}

template <class T, int DH, int E, bool kValues = true>
__global__ void __launch_bounds__(128) flash_chunk_attention_kernel(flash_params P) {
  using namespace flash_cfg;
  constexpr int kQS = DH + 8, kVS = E + 8, kNT = kValues ? E / 8 : 1;
  constexpr int kKVec = kKeys * DH / 8 / kThreads, kVVec = kValues ? kKeys * E / 8 / kThreads : 0;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kRows][kQS]
  T* ks = qs + kRows * kQS;                // [kKeys][kQS]
  T* vs = ks + kKeys * kQS;                // [kKeys][kVS]
  float* gq = reinterpret_cast<float*>(vs + (kValues ? kKeys * kVS : 0));  // restarted Gc of the query rows
  float* gk = gq + kRows;                                   // restarted Gc of the key rows (natural log)
  int* fk = reinterpret_cast<int*>(gk + kKeys);             // first key of each query row (its last reset)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const cta_coords at = flash_cta(P);
  const int qtile = at.tile;
  const int64_t qh = at.head, m = at.chunk, batch = at.batch;
  const int64_t kv = qh / (P.hq / P.h), bh = batch * P.h + kv;
  const int64_t first = m * P.c, len = min(P.c, P.t - first);
  const int q0 = qtile * kRows;  // local index of the first query row
  if (q0 >= len) return;

  const T* qbase = static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh;
  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + kv * P.k_sh;
  const T* vbase = static_cast<const T*>(P.v) + batch * P.v_sb + kv * P.v_sh;
  flash_load_queries<T, DH>(P, qbase, first, len, q0, bh, tid, qs, gq, fk);

  uint4 kreg[kKVec], vreg[kVVec > 0 ? kVVec : 1];
  float greg = 0.f;
  auto load_block = [&](int key0) {
#pragma unroll
    for (int i = 0; i < kKVec; ++i) {
      const int vi = tid + i * kThreads, s = vi / (DH / 8), c8 = vi % (DH / 8);
      kreg[i] = key0 + s < len ? *reinterpret_cast<const uint4*>(kbase + (first + key0 + s) * P.k_st + c8 * 8)
                               : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kVVec; ++i) {
      const int vi = tid + i * kThreads, s = vi / (E / 8), c8 = vi % (E / 8);
      vreg[i] = key0 + s < len ? *reinterpret_cast<const uint4*>(vbase + (first + key0 + s) * P.v_st + c8 * 8)
                               : make_uint4(0, 0, 0, 0);
    }
    if (tid < kKeys) greg = key0 + tid < len ? P.g.since_reset(bh, P.t, first + key0 + tid) : 0.f;
  };
  auto store_block = [&]() {
#pragma unroll
    for (int i = 0; i < kKVec; ++i) {
      const int vi = tid + i * kThreads, s = vi / (DH / 8), c8 = vi % (DH / 8);
      *reinterpret_cast<uint4*>(ks + s * kQS + c8 * 8) = kreg[i];
    }
#pragma unroll
    for (int i = 0; i < kVVec; ++i) {
      const int vi = tid + i * kThreads, s = vi / (E / 8), c8 = vi % (E / 8);
      *reinterpret_cast<uint4*>(vs + s * kVS + c8 * 8) = vreg[i];
    }
    if (tid < kKeys) gk[tid] = greg;
  };

  const int last_key = static_cast<int>(min(len, int64_t(q0 + kRows)));  // keys [0, last_key) matter
  const int blocks = (last_key + kKeys - 1) / kKeys;
  load_block(0);
  store_block();
  __syncthreads();

  // This warp's 16 query rows as A fragments, for every k16 slice of DH.
  uint32_t qa[DH / 16][4];
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk)
    ldmatrix_x4(qa[kk], qs + (warp * 16 + (lane & 15)) * kQS + kk * 16 + (lane >> 4) * 8);
  // The latest first key (after a reset) of the warp's rows: blocks from there on need no reset mask.
  // (Each row's own is read from shared memory in the masked blocks only, to keep registers free.)
  const flash_rows rows = warp_rows(q0, warp, g, gq, fk);

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};

  for (int blk = 0; blk < blocks; ++blk) {
    const int key0 = blk * kKeys;
    if (blk + 1 < blocks) load_block(key0 + kKeys);
    // Scores: Q K^T for 64 keys (8 n-tiles), then the terms and O += P V.
    float s[8][4];
    rows_times_rows<T, DH>(s, qa, ks, kQS, lane);
    float alpha[2];
    flash_block_weights(P, rows, gk, key0, len, g, tq, s, mrow, lrow, alpha);
    if constexpr (kValues) {
      uint32_t pa[4][4];
      flash_rescale_pack<T>(alpha, s, acc, pa);
      add_times_tile<T, E>(acc, pa, vs, kVS, lane);
    }
    __syncthreads();
    if (blk + 1 < blocks) {
      store_block();
      __syncthreads();
    }
  }
  flash_store_rows<kValues>(P, rows, batch, qh, first, len, tq, mrow, lrow, acc);
}

}  // namespace expanse_cuda
