// update_state as expand-MMA on tensor cores (mma.sync, sm_80+):
//   S_m[r, :] = sum_j w_j phi_r(k_j) v_j,   z_m[r] = sum_j w_j phi_r(k_j),   w_j = exp(A_m - Gc_j).
// A GEMM with M = D (rows of phi), N = e (+ one 8-wide tile whose first column is w_j, giving z),
// K = the chunk's tokens. The A operand, phi(K)^T, is never stored anywhere: each lane multiplies
// the p key entries of its fragment straight from a transposed key tile in shared memory (packed
// pairs of consecutive tokens, one rounding per product). The coefficient of row r is applied in
// the epilogue and the gate w_j is folded into the V tile, so the inner loop is loads, p-1 packed
// multiplies and MMAs.
//
// kSplit (the backward's forward sweep, whose state terms cancel and magnify a b16 rounding of the
// states): the gate goes to the A side instead, w_j phi(k_j) formed in f32 and split into b16 hi + lo,
// against the values as they are (exact in b16) and a column of ones for z: two MMAs per product, and
// the states keep about 16 significant bits instead of 8. (Splitting the gated values too took three
// MMAs, hi hi + hi lo + lo hi, for no more accuracy: 2.69 ms at P1 t = 65536 on an H100.)
//
// CTA: 8 warps, 256 rows of phi (32 per warp: two m16 tiles) x all e columns, over one chunk of one
// head. The K loop steps 32 tokens; the next tile is loaded into registers while the current one
// is multiplied (double-buffered shared memory, one barrier per step).
#pragma once

#include "kernels/common.cuh"
#include "kernels/sm80/mma.cuh"

namespace expanse_cuda {

struct mma_update_state_params {
  const void* k;
  const void* v;
  int64_t k_sb, k_st, k_sh;  // strides of k [b,t,h,d] (d contiguous)
  int64_t v_sb, v_st, v_sh;
  gates g;
  // kSplit only (null: the gates): each token's weight w_j in the gates' place, [b,t,h] f32
  // contiguous (the backward's cotangent states: exp(Gc_i) scale^p / den_i per query).
  const float* weight;
  // kSplit on the blocked kernel only (null: w_j): the weight of z's sums per token [b,t,h] (f32,
  // contiguous) in w_j's place, so that z_m = sum_j z_weight_j phi(k_j) comes with S_m (the cotangent
  // states' dden part, which a kernel of its own summed before).
  const float* z_weight;
  const phi_entry* table;
  phi_blocks blocks;  // for the blocked kernel only
  float* S;
  int64_t S_sb, S_sn, S_sh, S_sD;  // [b,n,h,D,e] (e contiguous)
  float* z;                        // null: no z
  int64_t z_sb, z_sn, z_sh, z_sD;
  int64_t t, c, n, h, D;
  int d, p;
  int row_tiles;  // CTAs per chunk and head along the rows of phi
  // The persistent blocked kernel (sm90/blocked_update_state.cuh): its tiles (row tiles x heads x
  // chunks x batch) and the sizes of its rings of step buffers and raw stages.
  int64_t tile_count;
  int ring, raw_stages;
};

namespace mma_update_state_cfg {
constexpr int kWarps = 8, kThreads = 256;
constexpr int kRows = 256;  // rows of phi per CTA
constexpr int kTok = 64;    // tokens per K step
constexpr int kTokPad = kTok + 8;
}  // namespace mma_update_state_cfg

// Stores the keys of tokens (2 sp, 2 sp + 1), features 8 c8 .. 8 c8 + 7 (one 16-byte vector each),
// transposed: one 32-bit word of both tokens per feature row of `kb` (row stride kTokPad).
template <class T, int kTokPad>
__device__ __forceinline__ void store_key_pair(T* kb, const uint4 (&keys)[2], int sp, int c8) {
  const T* e0 = reinterpret_cast<const T*>(&keys[0]);
  const T* e1 = reinterpret_cast<const T*>(&keys[1]);
#pragma unroll
  for (int j = 0; j < 8; ++j) *reinterpret_cast<uint32_t*>(kb + (c8 * 8 + j) * kTokPad + 2 * sp) = pack2(e0[j], e1[j]);
}

// Writes row r of the chunk state (and of z) times its coefficient cf, from this lane's accumulators
// of an m16n8 layout: acc(nt, u) is column 8 nt + 2 tq + u; column E (nt = kNT, held by tq = 0) is z.
template <int kNT, class Acc>
__device__ __forceinline__ void store_state_row(const mma_update_state_params& P, int64_t batch, int64_t m,
                                                int64_t head, int64_t r, float cf, int tq, Acc acc) {
  if (r >= P.D) return;
  float* out = P.S + batch * P.S_sb + m * P.S_sn + head * P.S_sh + r * P.S_sD;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    *reinterpret_cast<float2*>(out + nt * 8 + 2 * tq) = make_float2(acc(nt, 0) * cf, acc(nt, 1) * cf);
  if (P.z != nullptr && tq == 0) P.z[batch * P.z_sb + m * P.z_sn + head * P.z_sh + r * P.z_sD] = acc(kNT, 0) * cf;
}

// Shared memory bytes for d and E.
template <class T, int DH, int E, bool kSplit = false>
constexpr size_t mma_update_state_smem() {
  using namespace mma_update_state_cfg;
  return 2 * (size_t(DH + 1) * kTokPad + size_t(kTok) * (E + 8)) * sizeof(T) + (kSplit ? 2 * kTok * sizeof(float) : 0);
}

// kMaxP (2 or 4) bounds p at compile time: with the bound at 4 for every p, the factors k = 2, 3 of
// phi's products were issued (predicated off) for p = 2 too, a third of the loop's instructions.
template <class T, int DH, int E, bool kSplit = false, int kMaxP = 4>
__global__ void __launch_bounds__(256, 1) mma_update_state_kernel(mma_update_state_params P) {
  using namespace mma_update_state_cfg;
  constexpr int kVS = E + 8;             // row stride of the V tile (e columns + the z tile)
  constexpr int kNT = E / 8;             // n8 tiles of v
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int d = DH;
  // Two buffers each (addressed by arithmetic: an array of pointers indexed at run time would
  // live in local memory):
  //   keys [d+1][kTokPad], transposed; row d stays zero (the rows past D point there)
  //   values [kTok][kVS], gated; column E = the gate (gives z), E+1..E+7 = 0 (kSplit: the values as
  //   they are, column E = 1, and the gates [kTok] in f32 after both value buffers)
  T* const kT0 = reinterpret_cast<T*>(smem_raw);
  constexpr int kT_size = (d + 1) * kTokPad;
  T* const vs0 = kT0 + 2 * kT_size;
  constexpr int vs_size = kTok * kVS;
  float* const gw0 = reinterpret_cast<float*>(vs0 + 2 * vs_size);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const cta_coords at = decode_cta(P.row_tiles, P.h, P.n);
  const int row_tile = at.tile;
  const int64_t head = at.head, m = at.chunk, batch = at.batch;
  const int64_t first = m * P.c, len = min(P.c, P.t - first), bh = batch * P.h + head;
  const float A = P.g.chunk_total(bh, P.n, m);

  // This lane's 4 rows of phi (m tile mt, half hf: row g + 8 hf) and their key-row offsets.
  int koff[2][2][kMaxP];
  float coef[2][2];
  int64_t rows[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t r = int64_t(row_tile) * kRows + warp * 32 + mt * 16 + hf * 8 + g;
      rows[mt][hf] = r;
      phi_entry e{};
      if (r < P.D) e = P.table[r];
      coef[mt][hf] = r < P.D ? e.coef : 0.f;
#pragma unroll
      for (int k = 0; k < kMaxP; ++k) koff[mt][hf][k] = (r < P.D && k < P.p ? e.idx[k] : d) * kTokPad;
    }

  for (int i = tid; i < kTokPad; i += kThreads) {  // the zero row of both key buffers
    kT0[d * kTokPad + i] = from_f32<T>(0.f);
    kT0[kT_size + d * kTokPad + i] = from_f32<T>(0.f);
  }

  // Global -> register staging of one K step: keys and gated values as 16-byte vectors. Keys go
  // by pairs of tokens (2s, 2s+1) of one 8-feature slice, so that the transposed store writes
  // 32-bit words (both tokens of a feature) with at most 2-way bank conflicts.
  constexpr int kpairs = kTok / 2 * d / 8, vvec = kTok * E / 8;
  constexpr int kMaxKV = (kpairs + kThreads - 1) / kThreads, kMaxVV = (vvec + kThreads - 1) / kThreads;
  uint4 kreg[kMaxKV][2], vreg[kMaxVV];
  float gcreg[kMaxVV];  // Gc as loaded: no arithmetic on loads before the store (no waiting on them)
  float zgc = 0.f;
  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + head * P.k_sh;
  const T* vbase = static_cast<const T*>(P.v) + batch * P.v_sb + head * P.v_sh;
  // What a token's gate is made of: Gc, or its weight where the caller gives them.
  auto gc_of = [&](int64_t s) {
    if (s >= len) return 0.f;
    if (kSplit && P.weight) return P.weight[(batch * P.t + first + s) * P.h + head];
    return P.g.Gc ? P.g.Gc[bh * P.t + first + s] : 0.f;
  };
  auto gate = [&](int64_t s, float gc) {
    if (s >= len) return 0.f;
    if (kSplit && P.weight) return gc;
    if (!P.g.Gc) return 1.f;
    return kSplit ? expf(A - gc) : __expf(A - gc);  // __expf's error (2 + 1.16 |x| ulp) would pass 2^-17
  };

  auto load_step = [&](int64_t s0) {
#pragma unroll
    for (int i = 0; i < kMaxKV; ++i) {
      const int vi = tid + i * kThreads;
      if (vi < kpairs) {
        const int sp = vi % (kTok / 2), c8 = vi / (kTok / 2);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int64_t s = s0 + 2 * sp + u;
          kreg[i][u] = s < len ? *reinterpret_cast<const uint4*>(kbase + (first + s) * P.k_st + c8 * 8) : make_uint4(0, 0, 0, 0);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMaxVV; ++i) {
      const int vi = tid + i * kThreads;
      if (vi < vvec) {
        const int s = vi / (E / 8), c8 = vi % (E / 8);
        const bool in = s0 + s < len;
        vreg[i] = in ? *reinterpret_cast<const uint4*>(vbase + (first + s0 + s) * P.v_st + c8 * 8) : make_uint4(0, 0, 0, 0);
        gcreg[i] = gc_of(s0 + s);
      }
    }
    if (tid < kTok) zgc = gc_of(s0 + tid);
  };
  auto store_step = [&](int buf, int64_t s0) {
    T* const kb = kT0 + buf * kT_size;
    T* const vb = vs0 + buf * vs_size;
#pragma unroll
    for (int i = 0; i < kMaxKV; ++i) {
      const int vi = tid + i * kThreads;
      if (vi < kpairs) store_key_pair<T, kTokPad>(kb, kreg[i], vi % (kTok / 2), vi / (kTok / 2));
    }
#pragma unroll
    for (int i = 0; i < kMaxVV; ++i) {
      const int vi = tid + i * kThreads;
      if (vi < vvec) {
        const int s = vi / (E / 8), c8 = vi % (E / 8);
        uint4 out = vreg[i];
        if constexpr (!kSplit) {
          const T* e = reinterpret_cast<const T*>(&vreg[i]);
          T* o = reinterpret_cast<T*>(&out);
          const float w = gate(s0 + s, gcreg[i]);
#pragma unroll
          for (int j = 0; j < 8; ++j) o[j] = from_f32<T>(to_f32(e[j]) * w);
        }
        *reinterpret_cast<uint4*>(vb + s * kVS + c8 * 8) = out;
      }
    }
    if (tid < kTok) {
      uint4 zr = make_uint4(0, 0, 0, 0);
      const float x = gate(s0 + tid, zgc);
      reinterpret_cast<T*>(&zr)[0] = from_f32<T>(kSplit ? 1.f : x);
      *reinterpret_cast<uint4*>(vb + tid * kVS + E) = zr;
      if constexpr (kSplit) gw0[buf * kTok + tid] = x;
    }
  };

  float acc[2][kNT + 1][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt <= kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  const bool want_z = P.z != nullptr;
  const int64_t steps = (len + kTok - 1) / kTok;
  load_step(0);
  store_step(0, 0);
  __syncthreads();
  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step & 1);
    if (step + 1 < steps) load_step((step + 1) * kTok);
    const T* kb = kT0 + buf * kT_size;
    const T* vb = vs0 + buf * vs_size;
    const float* gw = gw0 + buf * kTok;
#pragma unroll
    for (int ks = 0; ks < kTok / 16; ++ks) {
      // A fragments: phi of this lane's rows at tokens (2tq, 2tq+1) and (2tq+8, 2tq+9).
      uint32_t a[2][4], a_lo[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int hf = q & 1, s = ks * 16 + 2 * tq + (q >> 1) * 8;
          uint32_t prod = *reinterpret_cast<const uint32_t*>(kb + koff[mt][hf][0] + s);
          if constexpr (kSplit) {  // the product and its gate in f32, then hi + lo
            float2 x = unpack2_f32<T>(prod);
#pragma unroll
            for (int k = 1; k < kMaxP; ++k)
              if (k < P.p) {
                const float2 y = unpack2_f32<T>(*reinterpret_cast<const uint32_t*>(kb + koff[mt][hf][k] + s));
                x.x *= y.x, x.y *= y.y;
              }
            const float2 w = *reinterpret_cast<const float2*>(gw + s);
            split2_f32<T>(x.x * w.x, x.y * w.y, a[mt][q], a_lo[mt][q]);
          } else {
#pragma unroll
            for (int k = 1; k < kMaxP; ++k)
              if (k < P.p) prod = mul2<T>(prod, *reinterpret_cast<const uint32_t*>(kb + koff[mt][hf][k] + s));
            a[mt][q] = prod;
          }
        }
      // B fragments two n-tiles at a time, straight into the MMAs.
      const int brow = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + brow * kVS + np * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_16816<T>(acc[mt][2 * np], a[mt], b);
          mma_16816<T>(acc[mt][2 * np + 1], a[mt], b + 2);
        }
        if constexpr (kSplit) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_16816<T>(acc[mt][2 * np], a_lo[mt], b);
            mma_16816<T>(acc[mt][2 * np + 1], a_lo[mt], b + 2);
          }
        }
      }
      if (want_z) {
        uint32_t b[2];
        ldmatrix_x2_trans(b, vb + brow * kVS + E);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_16816<T>(acc[mt][kNT], a[mt], b);
        if constexpr (kSplit)
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) mma_16816<T>(acc[mt][kNT], a_lo[mt], b);
      }
    }
    if (step + 1 < steps) store_step(buf ^ 1, (step + 1) * kTok);
    __syncthreads();
  }

  // Epilogue: rows times their coefficient, f32 out.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      store_state_row<kNT>(P, batch, m, head, rows[mt][hf], coef[mt][hf], tq,
                           [&](int nt, int u) { return acc[mt][nt][2 * hf + u]; });
}

}  // namespace expanse_cuda
