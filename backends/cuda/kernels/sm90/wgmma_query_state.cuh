// query_state as expand-MMA on Hopper's warpgroup tensor cores (wgmma, sm_90a): for the tokens i
// of chunk m,
//   num_i = phi(scale q_i)^T S_m exp(Gc_i),   den_i = phi(scale q_i)^T z_m exp(Gc_i),
// combined with the intra-chunk terms and normalized in the epilogue (as mma_query_state.cuh).
// M = tokens, N = e + 8 (the state's e columns and an 8-wide tile whose first column is z),
// K = D. A = phi(Q) is formed in registers from the query tile in shared memory (pairs of
// consecutive rows of phi, never stored); B = the state rows, converted to b16 with phi's
// coefficients folded in, in shared memory as wgmma's K-major core matrices.
//
// CTA: 2 warpgroups x one m64 tile = 128 tokens of one chunk x all e, over one query head. K steps
// of 64 rows of the state; the next step's rows are loaded into registers while the current one
// is multiplied.
#pragma once

#include "kernels/common.cuh"
#include "kernels/sm80/mma_query_state.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

namespace wgmma_query_state_cfg {
constexpr int kThreads = 256;  // 2 warpgroups
constexpr int kTokens = 128;   // tokens per CTA
constexpr int kRowsK = 64;     // rows of the state per K step
constexpr int kMaxD = 256;
// The B tile of one step: 8 chunks of 8 state rows, each the N/8 core matrices (8 columns x 8 rows)
// and 16 bytes of padding (which spreads a warp's 32-bit stores of row pairs over all banks).
template <int N> constexpr int chunk_elems() { return N * 8 + 8; }
template <int N> constexpr int b_tile_elems() { return kRowsK / 8 * chunk_elems<N>(); }
}  // namespace wgmma_query_state_cfg

// The CTA's query tile in shared memory: kTok rows of d entries and a column of ones at d (rows
// past ntok zero), and rows 1..7 of the z tile of each of `tiles` B tiles set to zero (row 0 holds
// z and is written every step).
template <class T, int kTok, int kNT, int kChunk>
__device__ __forceinline__ void init_query_tiles(const mma_query_state_params& P, T* qs, int qs_stride, int64_t batch,
                                                 int64_t qh, int64_t tok0, int64_t ntok, T* bt0, int tiles,
                                                 int b_size) {
  const int d = P.d, tid = threadIdx.x, threads = blockDim.x;
  const T* qbase = static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh;
  for (int vi = tid; vi < kTok * d / 8; vi += threads) {
    const int s = vi / (d / 8), c8 = vi % (d / 8);
    const uint4 val = s < ntok ? *reinterpret_cast<const uint4*>(qbase + (tok0 + s) * P.q_st + c8 * 8) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(qs + s * qs_stride + c8 * 8) = val;
  }
  for (int s = tid; s < kTok; s += threads) qs[s * qs_stride + d] = from_f32<T>(1.f);
  constexpr int kZeros = (wgmma_query_state_cfg::kRowsK / 8) * 64;  // per B tile
  for (int i = tid; i < tiles * kZeros; i += threads) {
    const int tile = i / kZeros, rest = i % kZeros;
    bt0[tile * b_size + (rest / 64) * kChunk + kNT * 64 + rest % 64] = from_f32<T>(0.f);
  }
}

template <class T, int E>
constexpr size_t wgmma_query_state_smem(int d) {
  using namespace wgmma_query_state_cfg;
  return size_t(kTokens) * (d + 8) * sizeof(T) + 2 * size_t(b_tile_elems<E + 8>()) * sizeof(T) +
         2 * size_t(kRowsK) * 4 * sizeof(int);
}

// PM: 2 for p <= 2, 4 for p <= 4. Every fragment multiplies PM query columns, the ones past p
// pointing at column d of the query tile, which holds ones: straight-line loads the compiler can
// batch, where a branch on the run-time p would serialize them.
template <class T, int E, int PM>
__global__ void __launch_bounds__(256, E <= 64 ? 2 : 1) wgmma_query_state_kernel(mma_query_state_params P) {
  using namespace wgmma_query_state_cfg;
  constexpr int N = E + 8;
  constexpr int kNT = E / 8;  // 8-column blocks of the state; block kNT is the z tile
  constexpr int kChunk = chunk_elems<N>();
  constexpr int b_size = b_tile_elems<N>();
  constexpr int kRowPairs = kRowsK / 2;
  constexpr int kItems = kRowPairs * E / 4;  // (row pair, 4 columns) per item
  constexpr int kMaxItems = (kItems + kThreads - 1) / kThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = P.d, qs_stride = d + 8;
  // Two B tiles and two index tiles (the q columns of each state row), then the query tile.
  T* const bt0 = reinterpret_cast<T*>(smem_raw);
  int* const sidx0 = reinterpret_cast<int*>(bt0 + 2 * b_size);
  constexpr int sidx_size = kRowsK * 4;
  T* const qs = reinterpret_cast<T*>(sidx0 + 2 * sidx_size);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const query_tile at = decode_query_tile(P, kTokens);
  if (at.ntok <= 0) return;
  const int64_t qh = at.qh, m = at.chunk, batch = at.batch, kv = at.kv, bh = at.bh, tok0 = at.tok0, ntok = at.ntok;

  init_query_tiles<T, kTokens, kNT, kChunk>(P, qs, qs_stride, batch, qh, tok0, ntok, bt0, 2, b_size);

  const float* Sbase = P.S + batch * P.S_sb + m * P.S_sn + kv * P.S_sh;
  const float* zbase = P.z ? P.z + batch * P.z_sb + m * P.z_sn + kv * P.z_sh : nullptr;
  float4 sreg[kMaxItems][2];
  float creg[kMaxItems][2];
  float zreg[2] = {0.f, 0.f};
  int ireg[4] = {0, 0, 0, 0};
  auto coef_of = [&](int64_t r) { return r < P.D ? P.table[r].coef : 0.f; };
  auto load_step = [&](int64_t r0) {
#pragma unroll
    for (int i = 0; i < kMaxItems; ++i) {
      const int item = tid + i * kThreads, rp = item % kRowPairs, c4 = item / kRowPairs;
      if (item < kItems)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int64_t r = r0 + 2 * rp + u;
          sreg[i][u] = r < P.D ? *reinterpret_cast<const float4*>(Sbase + r * P.S_sD + c4 * 4) : make_float4(0, 0, 0, 0);
          creg[i][u] = coef_of(r);
        }
    }
    if (tid < kRowPairs)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int64_t r = r0 + 2 * tid + u;
        zreg[u] = zbase && r < P.D ? zbase[r * P.z_sD] : 0.f;  // times its coefficient at the store
      }
    if (tid >= kThreads - kRowsK) {
      const int64_t r = r0 + (tid - (kThreads - kRowsK));
      const phi_entry e = r < P.D ? P.table[r] : phi_entry{};
#pragma unroll
      for (int k = 0; k < 4; ++k) ireg[k] = k < P.p ? e.idx[k] : d;
    }
  };
  auto store_step = [&](int buf) {
    uint32_t* const bw = reinterpret_cast<uint32_t*>(bt0 + buf * b_size);  // the B tile as words
    // Row pair rp lies in chunk rp / 4 at word rp % 4 of each core-matrix row.
#pragma unroll
    for (int i = 0; i < kMaxItems; ++i) {
      const int item = tid + i * kThreads, rp = item % kRowPairs, c4 = item / kRowPairs;
      if (item < kItems) {
        const float* s0 = reinterpret_cast<const float*>(&sreg[i][0]);
        const float* s1 = reinterpret_cast<const float*>(&sreg[i][1]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = c4 * 4 + j;
          bw[(rp / 4) * (kChunk / 2) + (col / 8) * 32 + (col % 8) * 4 + rp % 4] =
              pack2_f32<T>(s0[j] * creg[i][0], s1[j] * creg[i][1]);
        }
      }
    }
    // Item 0 of thread tid < kRowPairs is row pair tid: creg[0] holds its coefficients.
    if (tid < kRowPairs)
      bw[(tid / 4) * (kChunk / 2) + kNT * 32 + tid % 4] = pack2_f32<T>(zreg[0] * creg[0][0], zreg[1] * creg[0][1]);
    if (tid >= kThreads - kRowsK)
      *reinterpret_cast<int4*>(sidx0 + buf * sidx_size + (tid - (kThreads - kRowsK)) * 4) =
          make_int4(ireg[0], ireg[1], ireg[2], ireg[3]);
  };

  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;

  const int64_t steps = (P.D + kRowsK - 1) / kRowsK;
  load_step(0);
  store_step(0);
  fence_async_shared();
  __syncthreads();
  // This lane's two tokens: rows g and g+8 of its warp's 16 in its warpgroup's m64 tile.
  const T* qrow[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) qrow[hf] = qs + (warp * 16 + hf * 8 + g) * qs_stride;

  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step & 1);
    if (step + 1 < steps) load_step((step + 1) * kRowsK);
    const T* bt = bt0 + buf * b_size;
    const int* ib = sidx0 + buf * sidx_size;
    uint32_t a[kRowsK / 16][4];
#pragma unroll
    for (int ks = 0; ks < kRowsK / 16; ++ks) {
      // The q columns of the 4 phi rows (2tq, 2tq+1, 2tq+8, 2tq+9) this lane's fragment uses.
      int cols[4][PM];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = ks * 16 + 2 * tq + (j & 1) + (j >> 1) * 8;
        if constexpr (PM == 2) {
          const int2 v = *reinterpret_cast<const int2*>(ib + r * 4);
          cols[j][0] = v.x; cols[j][1] = v.y;
        } else {
          const int4 v = *reinterpret_cast<const int4*>(ib + r * 4);
          cols[j][0] = v.x; cols[j][1] = v.y; cols[j][2] = v.z; cols[j][3] = v.w;
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const T* row = qrow[q & 1];
        const int j0 = (q >> 1) * 2;  // phi rows j0 and j0+1 of cols[]
        uint32_t prod = pack2(row[cols[j0][0]], row[cols[j0 + 1][0]]);
#pragma unroll
        for (int k = 1; k < PM; ++k) prod = mul2<T>(prod, pack2(row[cols[j0][k]], row[cols[j0 + 1][k]]));
        a[ks][q] = prod;
      }
      wgmma_fence();
      wgmma_rs<T, N>(acc, a[ks], kmajor_desc(bt + ks * 2 * kChunk, kChunk * sizeof(T), 128));
    }
    wgmma_commit();
    if (step + 1 < steps) store_step(buf ^ 1);
    fence_async_shared();
    wgmma_wait<0>();
    wgmma_pin(acc);
    __syncthreads();
  }

  // Epilogue: decay, scale^p, the intra-chunk term, normalization (den: column E, held by tq = 0).
  T* obase = static_cast<T*>(P.o) + batch * P.o_sb + qh * P.o_sh;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int local = warp * 16 + hf * 8 + g;
    const float den = __shfl_sync(0xffffffffu, acc[4 * kNT + 2 * hf], lane & ~3);
    if (local >= ntok) continue;
    store_query_output<T, kNT>(P, obase, batch, qh, bh, tok0 + local, tq, den,
                               [&](int nt, int u) { return acc[4 * nt + 2 * hf + u]; });
  }
}

}  // namespace expanse_cuda
