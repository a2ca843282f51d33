// update_state as expand-MMA on Hopper's warpgroup tensor cores (wgmma, sm_90a):
//   S_m[r, :] = sum_j w_j phi_r(k_j) v_j,   z_m[r] = sum_j w_j phi_r(k_j),   w_j = exp(A_m - Gc_j).
// The GEMM of the sm80 kernel (sm80/mma_update_state.cuh): M = rows of phi, N = e + 8 (the e columns
// of v and an 8-wide tile whose first column is w_j, giving z), K = the chunk's tokens. A = phi(K)^T
// is formed in registers from a transposed key tile (never stored anywhere); B = the gated values,
// in shared memory as wgmma's K-major core matrices, read by the tensor cores directly (one read
// per warpgroup instead of one ldmatrix per warp).
//
// CTA: 2 warpgroups x 2 m64 tiles = 256 rows of phi x all e columns, over one chunk of one head.
// K steps of 64 tokens: while one step's products run asynchronously, the next step's keys and
// values (loaded into registers before) are stored to the other shared-memory buffer.
#pragma once

#include "kernels/common.cuh"
#include "kernels/sm80/mma_update_state.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

namespace wgmma_update_state_cfg {
constexpr int kThreads = 256;  // 2 warpgroups
constexpr int kRows = 256;     // rows of phi per CTA: 2 warpgroups x 2 m64 tiles
constexpr int kTok = 64;       // tokens per K step
constexpr int kTokPad = kTok + 8;
// The B tile of one step: 8 chunks of 8 tokens; a chunk holds the N/8 core matrices (8 columns x 8
// tokens, 128 bytes each) and 16 bytes of padding, which puts the 8 chunks of a 32-bit store of
// two tokens on different banks.
template <int N> constexpr int chunk_elems() { return N * 8 + 8; }
template <int N> constexpr int b_tile_elems() { return kTok / 8 * chunk_elems<N>(); }
}  // namespace wgmma_update_state_cfg

template <class T, int DH, int E>
constexpr size_t wgmma_update_state_smem() {
  using namespace wgmma_update_state_cfg;
  return 2 * (size_t(DH + 2) * kTokPad + size_t(b_tile_elems<E + 8>())) * sizeof(T);
}

// PM: 2 for p <= 2, 4 for p <= 4. Every fragment multiplies PM key rows, the ones past p pointing
// at a row of ones: straight-line loads the compiler can batch, where a branch on the run-time p
// would serialize them.
template <class T, int DH, int E, int PM>
__global__ void __launch_bounds__(256, 1) wgmma_update_state_kernel(mma_update_state_params P) {
  using namespace wgmma_update_state_cfg;
  constexpr int N = E + 8;      // e columns + the z tile
  constexpr int kNT = E / 8;    // 8-column blocks of v; block kNT is the z tile
  constexpr int kChunk = chunk_elems<N>();
  constexpr int d = DH;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Two buffers each (addressed by arithmetic, not by a run-time indexed pointer array):
  //   keys [d+2][kTokPad], transposed; row d is zero (rows of phi past D point there), row d+1 ones
  //   B tile: gated values and the z tile, K-major core matrices
  T* const kT0 = reinterpret_cast<T*>(smem_raw);
  constexpr int kT_size = (d + 2) * kTokPad;
  constexpr int b_size = b_tile_elems<N>();
  T* const vb0 = kT0 + 2 * kT_size;
  static_assert((2 * kT_size * sizeof(T)) % 16 == 0, "the B tile must start 16-byte aligned");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup, warp within it
  const cta_coords at = decode_cta(P.row_tiles, P.h, P.n);
  const int row_tile = at.tile;
  const int64_t head = at.head, m = at.chunk, batch = at.batch;
  const int64_t first = m * P.c, len = min(P.c, P.t - first), bh = batch * P.h + head;
  const float A = P.g.chunk_total(bh, P.n, m);

  // This lane's rows of phi (m64 tile mt, half hf: row 16 wq + g + 8 hf of the tile).
  int koff[2][2][PM];
  float coef[2][2];
  int64_t rows[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t r = int64_t(row_tile) * kRows + wg * 128 + mt * 64 + wq * 16 + hf * 8 + g;
      rows[mt][hf] = r;
      phi_entry e{};
      if (r < P.D) e = P.table[r];
      coef[mt][hf] = r < P.D ? e.coef : 0.f;
#pragma unroll
      for (int k = 0; k < PM; ++k) koff[mt][hf][k] = (r >= P.D ? (k == 0 ? d : d + 1) : k < P.p ? e.idx[k] : d + 1) * kTokPad;
    }

  // Once: the zero and ones key rows and the z tiles of both buffers (only their row 0 changes).
  for (int i = tid; i < kTokPad; i += kThreads)
#pragma unroll
    for (int buf = 0; buf < 2; ++buf) {
      kT0[buf * kT_size + d * kTokPad + i] = from_f32<T>(0.f);
      kT0[buf * kT_size + (d + 1) * kTokPad + i] = from_f32<T>(1.f);
    }
  for (int i = tid; i < 2 * (kTok / 8) * 64; i += kThreads) {
    const int buf = i / ((kTok / 8) * 64), rest = i % ((kTok / 8) * 64), chunk = rest / 64;
    vb0[buf * b_size + chunk * kChunk + kNT * 64 + rest % 64] = from_f32<T>(0.f);
  }

  // Global -> register staging of one K step, by pairs of tokens (2s, 2s+1) so that the transposed
  // stores write 32-bit words holding both tokens. Keys: one 8-feature slice per item; values: one
  // 8-column slice per item, times the tokens' gates.
  constexpr int kPairs = kTok / 2;
  constexpr int kKeyItems = kPairs * d / 8, kValItems = kPairs * E / 8;
  constexpr int kMaxK = (kKeyItems + kThreads - 1) / kThreads, kMaxV = (kValItems + kThreads - 1) / kThreads;
  uint4 kreg[kMaxK][2], vreg[kMaxV][2];
  float gcreg[kMaxV][2];  // the tokens' Gc as loaded: no arithmetic on loads until the store, so
                          // that no instruction waits for them while the step's products issue
  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + head * P.k_sh;
  const T* vbase = static_cast<const T*>(P.v) + batch * P.v_sb + head * P.v_sh;
  auto gc_of = [&](int64_t s) { return P.g.Gc && s < len ? P.g.Gc[bh * P.t + first + s] : 0.f; };
  auto gate = [&](int64_t s, float gc) { return s < len ? (P.g.Gc ? __expf(A - gc) : 1.f) : 0.f; };
  auto row_of = [&](const T* base, int64_t stride, int64_t s, int c8) {
    return s < len ? *reinterpret_cast<const uint4*>(base + (first + s) * stride + c8 * 8) : make_uint4(0, 0, 0, 0);
  };

  auto load_step = [&](int64_t s0) {
#pragma unroll
    for (int i = 0; i < kMaxK; ++i) {
      const int item = tid + i * kThreads, sp = item % kPairs, c8 = item / kPairs;
      if (item < kKeyItems)
#pragma unroll
        for (int u = 0; u < 2; ++u) kreg[i][u] = row_of(kbase, P.k_st, s0 + 2 * sp + u, c8);
    }
#pragma unroll
    for (int i = 0; i < kMaxV; ++i) {
      const int item = tid + i * kThreads, sp = item % kPairs, c8 = item / kPairs;
      if (item < kValItems)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          vreg[i][u] = row_of(vbase, P.v_st, s0 + 2 * sp + u, c8);
          gcreg[i][u] = gc_of(s0 + 2 * sp + u);
        }
    }
  };
  // Item 0 of thread tid < kPairs is token pair tid: its gates also fill the z tile.
  auto store_step = [&](int buf, int64_t s0) {
    T* const kb = kT0 + buf * kT_size;
    uint32_t* const vw = reinterpret_cast<uint32_t*>(vb0 + buf * b_size);  // the B tile as words
#pragma unroll
    for (int i = 0; i < kMaxK; ++i) {
      const int item = tid + i * kThreads, sp = item % kPairs, c8 = item / kPairs;
      if (item < kKeyItems) store_key_pair<T, kTokPad>(kb, kreg[i], sp, c8);
    }
    // Token pair sp lies in chunk sp / 4 at word sp % 4 of each core-matrix row.
#pragma unroll
    for (int i = 0; i < kMaxV; ++i) {
      const int item = tid + i * kThreads, sp = item % kPairs, c8 = item / kPairs;
      if (item < kValItems) {
        const T* e0 = reinterpret_cast<const T*>(&vreg[i][0]);
        const T* e1 = reinterpret_cast<const T*>(&vreg[i][1]);
        const float w0 = gate(s0 + 2 * sp, gcreg[i][0]), w1 = gate(s0 + 2 * sp + 1, gcreg[i][1]);
        uint32_t* out = vw + (sp / 4) * (kChunk / 2) + c8 * 32 + sp % 4;
#pragma unroll
        for (int j = 0; j < 8; ++j) out[j * 4] = pack2_f32<T>(to_f32(e0[j]) * w0, to_f32(e1[j]) * w1);
        if (i == 0 && tid < kPairs) vw[(sp / 4) * (kChunk / 2) + kNT * 32 + sp % 4] = pack2_f32<T>(w0, w1);
      }
    }
  };

  float acc[2][N / 2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[mt][i] = 0.f;

  const int64_t steps = (len + kTok - 1) / kTok;
  load_step(0);
  store_step(0, 0);
  fence_async_shared();
  __syncthreads();
  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step & 1);
    if (step + 1 < steps) load_step((step + 1) * kTok);
    const T* kb = kT0 + buf * kT_size;
    const T* vb = vb0 + buf * b_size;
    // A fragments of the whole step stay untouched until the step's products complete.
    uint32_t a[kTok / 16][2][4];
#pragma unroll
    for (int ks = 0; ks < kTok / 16; ++ks) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int hf = q & 1, s = ks * 16 + 2 * tq + (q >> 1) * 8;
          uint32_t prod = *reinterpret_cast<const uint32_t*>(kb + koff[mt][hf][0] + s);
#pragma unroll
          for (int k = 1; k < PM; ++k) prod = mul2<T>(prod, *reinterpret_cast<const uint32_t*>(kb + koff[mt][hf][k] + s));
          a[ks][mt][q] = prod;
        }
      const uint64_t desc = kmajor_desc(vb + ks * 2 * kChunk, kChunk * sizeof(T), 128);
      wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) wgmma_rs<T, N>(acc[mt], a[ks][mt], desc);
    }
    wgmma_commit();
    if (step + 1 < steps) store_step(buf ^ 1, (step + 1) * kTok);
    fence_async_shared();
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) wgmma_pin(acc[mt]);
    __syncthreads();
  }

  // Epilogue: rows times their coefficient, f32 out.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      store_state_row<kNT>(P, batch, m, head, rows[mt][hf], coef[mt][hf], tq,
                           [&](int nt, int u) { return acc[mt][4 * nt + 2 * hf + u]; });
}

}  // namespace expanse_cuda
