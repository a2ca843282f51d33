// update_state's tile product on Blackwell (tcgen05, sm_100a): the first piece of the fused kernel's
// tcgen05 form (docs/fused.md, "Blackwell"), with the state tile as the accumulator in tensor memory:
//   S[r, :] = sum_j A[r, j] v_j,  z[r] = sum_j A[r, j],  A[r, j] = w_j prod_i k_j[idx_i(r)]
// (w_j = exp(A_m - Gc_j), the key's decay to its chunk end; the layout coefficient of row r is applied
// when the tile leaves TMEM), one CTA per 128 rows of phi, chunk and head, in K steps of 64 tokens:
//
// - all 128 threads copy the step's keys and values, then thread r forms row r of A (its 64 tokens)
//   in b16 into a K-major tile with the 128-byte swizzle;
// - B is the values as copied (N-major, 64 per 128-byte row) beside a block whose column 0 is ones
//   (z), N = e + 16;
// - thread 0 issues the step's four tcgen05.mma (M = 128, K = 16 each) into TMEM and commits them
//   to an mbarrier, which every thread waits on before the tiles are rewritten;
// - at the end each warp reads its 32 lanes (rows) from TMEM, times the rows' coefficients, into S
//   and z.
//
// Single-buffered and not warp-specialized: a statement of the data path (descriptors, TMEM
// allocation, commit, load) that compiles, not a tuned kernel. It is in no implementation list: no
// Blackwell device is lent here, so it has never run (docs/fused.md says what the fused form adds).
// With 16-bit rounding of A it has the forward's accuracy, not the split states' (docs/performance.md,
// accuracy lesson 10).
#pragma once

#include "kernels/sm100/tcgen05.cuh"
#include "kernels/sm80/mma_update_state.cuh"
#include "kernels/sm90/bulk_copy.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace expanse_cuda {

namespace tcgen05_update_state_cfg {
constexpr int kThreads = 128, kRows = 128, kTok = 64;
constexpr int kRowBytes = 128;                    // one swizzled row: 64 b16 values
constexpr int kTileBytes = kTok * kRowBytes;      // A (128 rows x 64 tokens) is 2 of these, B's blocks 1 each
}  // namespace tcgen05_update_state_cfg

template <class T, int DH, int E>
constexpr size_t tcgen05_update_state_smem() {
  using namespace tcgen05_update_state_cfg;
  return 1024 /* alignment */ + 2 * size_t(kTileBytes) /* A */ + 2 * size_t(kTileBytes) /* B */ +
         size_t(kTok) * (DH + 8) * sizeof(T) /* keys */ + kTok * sizeof(float) /* gates */ +
         sizeof(uint64_t) + sizeof(uint32_t);
}

template <class T, int DH, int E>
__global__ void __launch_bounds__(tcgen05_update_state_cfg::kThreads, 1)
    tcgen05_update_state_kernel(mma_update_state_params P) {
  using namespace tcgen05_update_state_cfg;
  static_assert(E == 64, "B's value block is one 128-byte row of values per token");
  constexpr int N = E + 16, kColumns = 128, kKS = DH + 8;  // TMEM columns: a power of two >= N
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* const a_tile = static_cast<unsigned char*>(
      __builtin_assume_aligned(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024), 1024));
  unsigned char* const b_tile = a_tile + 2 * kTileBytes;  // [2 blocks][kTok rows][128 bytes]
  T* const keys = reinterpret_cast<T*>(b_tile + 2 * kTileBytes);  // [kTok][kKS]
  float* const gate = reinterpret_cast<float*>(keys + kTok * kKS);
  uint64_t* const done = reinterpret_cast<uint64_t*>(gate + kTok);
  uint32_t* const tmem_at = reinterpret_cast<uint32_t*>(done + 1);

  const int tid = threadIdx.x, warp = tid >> 5;
  const cta_coords at = decode_cta(P.row_tiles, P.h, P.n);
  const int64_t head = at.head, m = at.chunk, batch = at.batch, bh = batch * P.h + head;
  const int64_t first = m * P.c, len = min(P.c, P.t - first);
  const int64_t row = int64_t(at.tile) * kRows + tid;  // this thread's row of phi
  const phi_entry entry = row < P.D ? P.table[row] : phi_entry{};

  // B's second block: column 0 is one in every token row (z), the rest zero; written once.
  for (int i = tid; i < kTok * 8; i += kThreads) {
    const int s = i / 8, c = i % 8;
    const uint32_t one = c == 0 ? pack2_f32<T>(1.f, 0.f) : 0u;
    *reinterpret_cast<uint4*>(b_tile + kTileBytes + swizzled_row_offset(s, c, kRowBytes)) = make_uint4(one, 0, 0, 0);
  }
  if (warp == 0) tmem_alloc<kColumns>(tmem_at);
  if (tid == 0) {
    mbarrier_init(done, 1);
    mbarrier_init_fence();
  }
  tcgen05_fence_before();
  __syncthreads();
  tcgen05_fence_after();
  const uint32_t tmem = *tmem_at;

  const uint64_t a_desc = umma_swizzled_desc(a_tile, 16, 8 * kRowBytes);
  const uint64_t b_desc = umma_swizzled_desc(b_tile, kTileBytes, 8 * kRowBytes);
  constexpr uint32_t idesc = umma_f16_idesc<T>(kRows, N, false, true);
  constexpr uint32_t kASliceDesc = 32 / 16, kBSliceDesc = 16 * kRowBytes / 16;  // per K step of 16

  const T* kbase = static_cast<const T*>(P.k) + batch * P.k_sb + head * P.k_sh;
  const T* vbase = static_cast<const T*>(P.v) + batch * P.v_sb + head * P.v_sh;
  const gates g = P.g;
  uint32_t phase = 0;
  const int steps = static_cast<int>((len + kTok - 1) / kTok);
  for (int step = 0; step < steps; ++step) {
    const int64_t s0 = int64_t(step) * kTok;
    // The step's keys (row-major, for the rows' products), values (B's first block) and gates; zeros
    // past the chunk.
    for (int i = tid; i < kTok * DH / 8; i += kThreads) {
      const int s = i / (DH / 8), c = i % (DH / 8);
      *reinterpret_cast<uint4*>(keys + s * kKS + c * 8) =
          s0 + s < len ? *reinterpret_cast<const uint4*>(kbase + (first + s0 + s) * P.k_st + c * 8) : make_uint4(0, 0, 0, 0);
    }
    for (int i = tid; i < kTok * 8; i += kThreads) {
      const int s = i / 8, c = i % 8;
      *reinterpret_cast<uint4*>(b_tile + swizzled_row_offset(s, c, kRowBytes)) =
          s0 + s < len ? *reinterpret_cast<const uint4*>(vbase + (first + s0 + s) * P.v_st + c * 8) : make_uint4(0, 0, 0, 0);
    }
    if (tid < kTok) gate[tid] = s0 + tid < len ? g.to_chunk_end(bh, P.t, P.n, m, first + s0 + tid) : 0.f;
    __syncthreads();
    // Row `row` of A: its 64 tokens, 8 per 16-byte chunk.
#pragma unroll
    for (int c = 0; c < kTok / 8; ++c) {
      uint32_t w[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float x[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int s = 8 * c + 2 * u + h;
          float a = row < P.D ? gate[s] : 0.f;
          for (int i = 0; i < P.p; ++i) a *= to_f32(keys[s * kKS + entry.idx[i]]);
          x[h] = a;
        }
        w[u] = pack2_f32<T>(x[0], x[1]);
      }
      *reinterpret_cast<uint4*>(a_tile + swizzled_row_offset(tid, c, kRowBytes)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    fence_async_shared();  // A and B, for the tensor cores
    __syncthreads();
    if (tid == 0) {
      tcgen05_fence_after();
#pragma unroll
      for (int kk = 0; kk < kTok / 16; ++kk)
        tcgen05_mma_f16(tmem, a_desc + kk * kASliceDesc, b_desc + kk * kBSliceDesc, idesc, step > 0 || kk > 0);
      tcgen05_commit(done);
    }
    mbarrier_wait(done, phase);  // the products have read the tiles
    phase ^= 1;
    tcgen05_fence_after();
  }

  // The tile out of TMEM: warp w's lanes are rows 32 w .. 32 w + 31, 16 columns per load.
  const uint32_t lane_base = tmem + (uint32_t(warp * 32) << 16);
  float* const srow = P.S + batch * P.S_sb + m * P.S_sn + head * P.S_sh + row * P.S_sD;
#pragma unroll
  for (int c0 = 0; c0 < N; c0 += 16) {
    uint32_t r[16];
    tcgen05_ld_16(lane_base + c0, r);
    tcgen05_wait_ld();
    if (row >= P.D || steps == 0) continue;
    if (c0 < E) {
#pragma unroll
      for (int i = 0; i < 16; ++i) srow[c0 + i] = __uint_as_float(r[i]) * entry.coef;
    } else if (P.z != nullptr) {
      P.z[batch * P.z_sb + m * P.z_sn + head * P.z_sh + row * P.z_sD] = __uint_as_float(r[0]) * entry.coef;
    }
  }
  tcgen05_fence_before();
  __syncthreads();
  if (warp == 0) tmem_dealloc<kColumns>(tmem);
}

}  // namespace expanse_cuda
