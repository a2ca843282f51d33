// query_state at p = 2 as one f16 expand-MMA per K step, warp-specialized (Hopper, sm_90a): the GEMM
// of blocked_query_state.cuh (one phi block of 64 rows per K step, phi(Q) formed in registers from
// the query tile) with a single f16 product per step where that kernel does three bf16 hi/lo
// products, and B tiles that a pass has already converted (f16_state_tiles.cuh).
//
// Accuracy: the state rows are rounded once to f16 times their column's power-of-two scale (by the
// pass), and the query tile is converted to f16 in place, each token's row times a power of two that
// keeps |phi| under 2^15. f16's 11 bits keep the strongly gated inputs within SPEC's bf16 bound where
// bf16's 8 do not; both scales are undone, exactly, in the epilogue. (At p = 3, 4 this measured up
// to 4e-3, too close to the bound: those keep the split form.)
//
// CTA: 2 consumer warpgroups and one producer warp. Each consumer warpgroup holds MT m64 tiles of
// tokens (128 MT tokens per CTA, one chunk, all e, one query head), forms A and multiplies. The
// producer's first lane copies each step's ready B tile (one bulk copy of the tile's bytes) into a
// ring of buffers, each with a "full" transaction barrier (the copy's bytes have landed) and an
// "empty" one (every consumer warp has finished its products of the tile), bulk_copy.cuh. Earlier
// forms converted the state rows inside this kernel, four times per state at c = 1024 and on the
// critical path; the producers could not keep up (docs/performance.md).
#pragma once

#include "kernels/sm90/blocked_query_state.cuh"
#include "kernels/sm90/bulk_copy.cuh"
#include "kernels/sm90/f16_state_tiles.cuh"

namespace expanse_cuda {

namespace f16_query_state_cfg {
constexpr int kConsumerThreads = 256;            // two warpgroups (warps 0-7)
constexpr int kThreads = kConsumerThreads + 32;  // and the producer warp
constexpr int kConsumerWarps = kConsumerThreads / 32;
// A fragments in flight per consumer warpgroup: four K slices (one step), so the warps form the
// next slices while the tensor cores still run three. (A divisor of the 4 slices per step, so that
// a slice's slot is the same in every step.)
constexpr int kASlots = 4;
constexpr int kBuffers = 8;  // B tiles in flight: 72 KB at e = 64
}  // namespace f16_query_state_cfg

template <class T, int E, int MT>
constexpr size_t f16_query_state_smem(int d) {
  using namespace f16_query_state_cfg;
  return kBuffers * size_t(f16_state_tiles_cfg::tile_elems<E>()) * sizeof(__half) + 2 * kBuffers * sizeof(uint64_t) +
         size_t(128 * MT) * (d + 8) * sizeof(T) + (E + 1 + 4 * 128 * MT) * sizeof(float);
}

// The query tile in f16: each token's row of x (kTok rows of d, type T) rewritten in place as f16
// times 2^s, with s such that |x 2^s| < 2^(15 / p) (so |phi| < 2^15), the column of ones at d as f16
// ones; token_unscale[row] = 2^(-p s), the factor that undoes the scale of phi. Eight lanes per row,
// 16 bytes each (one thread per row ran 2 d dependent shared-memory accesses in the prologue).
template <class T, int kTok>
__device__ __forceinline__ void scale_query_tile_to_f16(T* qs, int qs_stride, int d, int p, float* token_unscale) {
  static_assert(kTok % 4 == 0, "whole warps of rows");
  const int sub = threadIdx.x % 8, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int row0 = warp * 4; row0 < kTok; row0 += warps * 4) {  // four rows per warp, the same trips
    const int row = row0 + (threadIdx.x % 32) / 8;
    T* const x = qs + row * qs_stride;
    float mx = 0.f;
    for (int c8 = sub; c8 < d / 8; c8 += 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(x + c8 * 8);
      const T* xs = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int k = 0; k < 8; ++k) mx = fmaxf(mx, fabsf(to_f32(xs[k])));
    }
#pragma unroll
    for (int o = 1; o < 8; o *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    int ex = 0;
    frexpf(mx, &ex);  // mx < 2^ex
    const int s = mx > 0.f && isfinite(mx) ? max(-60, min(60, 15 / p - ex)) : 0;
    const float f = ldexpf(1.f, s);
    for (int c8 = sub; c8 < d / 8; c8 += 8) {
      uint4 v = *reinterpret_cast<const uint4*>(x + c8 * 8);
      const T* xs = reinterpret_cast<const T*>(&v);
      const uint4 h = make_uint4(pack2_f32<__half>(to_f32(xs[0]) * f, to_f32(xs[1]) * f),
                                 pack2_f32<__half>(to_f32(xs[2]) * f, to_f32(xs[3]) * f),
                                 pack2_f32<__half>(to_f32(xs[4]) * f, to_f32(xs[5]) * f),
                                 pack2_f32<__half>(to_f32(xs[6]) * f, to_f32(xs[7]) * f));
      *reinterpret_cast<uint4*>(x + c8 * 8) = h;
    }
    if (sub == 0) {
      reinterpret_cast<__half*>(x)[d] = __float2half_rn(1.f);
      token_unscale[row] = ldexpf(1.f, -p * s);
    }
  }
}

// The kernel's epilogue, for consumer warpgroup wg's MT m64 tiles of sums acc (column E: the
// denominator, held by tq = 0): undo the token and column scales (both powers of two), then
// decay, scale^p, the intra-chunk term and normalization, as mma_query_state.cuh's
// store_query_output. The per-token inputs come from shared memory, staged in the prologue; the
// intra-chunk term is read through the read-only path (so that the compiler may move those loads
// above the stores); pairs of outputs are stored as one word.
template <class T, int E, int MT>
__device__ __forceinline__ void store_f16_outputs(const mma_query_state_params& P, const query_tile& at,
                                                  float (&acc)[MT][E / 2 + 4], int wg, const float* token_unscale,
                                                  const float* col_unscale, const float* token_g,
                                                  const float* token_rm, const float* token_l) {
  constexpr int kNT = E / 8;
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3, g = lane >> 2, tq = lane & 3;
  const bool intra = P.y != nullptr;
  float cu[kNT][2];  // this lane's columns' factors
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int u = 0; u < 2; ++u) cu[nt][u] = col_unscale[nt * 8 + 2 * tq + u];
  auto local_of = [&](int mt, int hf) { return (mt * 2 + wg) * 64 + wq * 16 + hf * 8 + g; };
  T* const obase = static_cast<T*>(P.o) + at.batch * P.o_sb + at.qh * P.o_sh;
  const bool pairs = P.o_se == 1 && P.o_st % 2 == 0 && reinterpret_cast<uintptr_t>(obase) % 4 == 0;
  const float f = P.scale_p;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int local = local_of(mt, hf);
      const float tu = token_unscale[local];
      const float den = __shfl_sync(0xffffffffu, acc[mt][4 * kNT + 2 * hf], lane & ~3) * (tu * col_unscale[E]);
      if (local >= at.ntok) continue;
      const output_weights w =
          output_weights_of(den * f, token_g[local], intra, token_l[local], token_rm[local], P.normalize != 0);
      const float wn = w.wn * f;
      T* const out = obase + (at.tok0 + local) * P.o_st;
      const float* const yrow = P.y + at.batch * P.y_sb + (at.tok0 + local) * P.y_st + at.qh * P.y_sh;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        float v[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float yv = intra ? __ldg(yrow + (nt * 8 + 2 * tq + u) * P.y_se) : 0.f;
          v[u] = (acc[mt][4 * nt + 2 * hf + u] * (tu * cu[nt][u]) * wn + yv * w.wy) * w.r;
        }
        const int col = nt * 8 + 2 * tq;
        if (pairs) {
          *reinterpret_cast<uint32_t*>(out + col) = pack2_f32<T>(v[0], v[1]);
        } else {
          out[col * P.o_se] = from_f32<T>(v[0]);
          out[(col + 1) * P.o_se] = from_f32<T>(v[1]);
        }
      }
    }
}

template <class T, int E, int MT>
__global__ void __launch_bounds__(f16_query_state_cfg::kThreads, 1) f16_query_state_kernel(mma_query_state_params P) {
  using namespace f16_query_state_cfg;
  constexpr int kTok = 128 * MT;
  constexpr int N = E + 8;
  constexpr int kChunk = f16_state_tiles_cfg::chunk_elems<E>();
  constexpr int b_size = f16_state_tiles_cfg::tile_elems<E>();
  constexpr uint32_t kTileBytes = b_size * sizeof(__half);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = P.d, qs_stride = d + 8;
  // The ring of B tiles, its barriers, the query tile (x, then x 2^s in f16), the state's column
  // scales (e, then z; then the factors that undo them), and per token: the factor that undoes its
  // scale and the epilogue's inputs (Gc, and with the intra-chunk term rowmax and l).
  __half* const bt0 = reinterpret_cast<__half*>(smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(bt0 + kBuffers * b_size);
  uint64_t* const empty = full + kBuffers;
  T* const qs = reinterpret_cast<T*>(empty + kBuffers);
  float* const col_unscale = reinterpret_cast<float*>(qs + kTok * qs_stride);
  float* const token_unscale = col_unscale + (E + 1);
  float* const token_g = token_unscale + kTok;
  float* const token_rm = token_g + kTok;
  float* const token_l = token_rm + kTok;

  const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, tq = tid & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const query_tile at = decode_query_tile(P, kTok);
  if (at.ntok <= 0) return;
  const int64_t qh = at.qh, batch = at.batch, tok0 = at.tok0, ntok = at.ntok;
  const int64_t steps = P.blocks.count;
  const int64_t state = (batch * P.n + at.chunk) * P.h + at.kv;
  const __half* const tiles = P.f16_tiles + state * steps * b_size;
  // Step f's tile into buffer f % kBuffers.
  auto issue = [&](int64_t f) {
    const int buf = static_cast<int>(f % kBuffers);
    mbarrier_arrive_expect_tx(&full[buf], kTileBytes);
    bulk_copy_to_shared(bt0 + buf * b_size, tiles + f * b_size, kTileBytes, &full[buf]);
  };

  const bool producer = tid == kConsumerThreads;
  if (producer) {
    // The first tiles start landing while the CTA loads its query tile.
    for (int b = 0; b < kBuffers; ++b) {
      mbarrier_init(&full[b], 1);
      mbarrier_init(&empty[b], kConsumerWarps);
    }
    mbarrier_init_fence();
    for (int64_t f = 0; f < kBuffers && f < steps; ++f) issue(f);
  }
  // Everything else the CTA reads once, by cp.async, all in flight together (tokens past ntok read
  // as zeros): the query tile, the column scales and the per-token inputs of the epilogue.
  {
    const T* const qbase = static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh;
    for (int vi = tid; vi < kTok * d / 8; vi += kThreads) {
      const int row = vi / (d / 8), c8 = vi % (d / 8);
      copy_async<16>(qs + row * qs_stride + c8 * 8, qbase + (tok0 + min(int64_t(row), ntok - 1)) * P.q_st + c8 * 8,
                     row < ntok);
    }
    if (tid <= E) copy_async<4>(col_unscale + tid, P.state_scales + state * (E + 1) + tid, true);
    for (int row = tid; row < kTok; row += kThreads) {
      const int64_t i = tok0 + min(int64_t(row), ntok - 1);
      copy_async<4>(token_g + row, P.g.Gc ? P.g.Gc + at.bh * P.t + i : P.state_scales, P.g.Gc && row < ntok);
      if (P.y) {
        copy_async<4>(token_rm + row, P.rowmax + batch * P.r_sb + i * P.r_st + qh * P.r_sh, row < ntok);
        copy_async<4>(token_l + row, P.l ? P.l + batch * P.l_sb + i * P.l_st + qh * P.l_sh : P.state_scales,
                      P.l && row < ntok);
      }
    }
    copy_async_commit();
    copy_async_wait<0>();
    // 1 / scale, exactly (powers of two; each thread inverts the scale it copied): the epilogue
    // multiplies where a division cost ten instructions per output.
    if (tid <= E) col_unscale[tid] = 1.f / col_unscale[tid];
  }
  __syncthreads();  // the query tile, the barriers
  scale_query_tile_to_f16<T, kTok>(qs, qs_stride, d, P.p, token_unscale);
  __syncthreads();  // the f16 query tile and the scales

  if (warp >= kConsumerWarps) {
    // Step f refills the buffer of step f - kBuffers once every consumer warp has released it.
    if (producer)
      for (int64_t f = kBuffers; f < steps; ++f) {
        mbarrier_wait(&empty[f % kBuffers], static_cast<uint32_t>((f / kBuffers - 1) & 1));
        issue(f);
      }
    return;
  }

  // Consumers: warpgroup wg holds rows g and g + 8 (hf) of its warp's 16 in each of its m64 tiles.
  float acc[MT][N / 2];
  wgmma_zero(acc);
  // Token row g of this lane's warp in m64 tile mt is at qrow + mt * mt_step, row g + 8 at + hf_step.
  const __half* const qrow = reinterpret_cast<const __half*>(qs + (wg * 64 + wq * 16 + g) * qs_stride);
  const int hf_step = 8 * qs_stride, mt_step = 128 * qs_stride;
  auto q_word = [&](int mt, int hf, int col) {  // x[col], x[col + 1] of a token as one word
    return *reinterpret_cast<const uint32_t*>(qrow + mt * mt_step + hf * hf_step + col);
  };

  phi_block cur = P.blocks.block[0];  // the block of the step being multiplied
  // The A fragments of K slice ks (slot ks % kASlots) are read by that slice's products (one wgmma
  // group each) until they complete; the slot is rewritten after waiting for that group only.
  uint32_t a[kASlots][MT][4];
  for (int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step % kBuffers);
    const phi_block next = step + 1 < steps ? P.blocks.block[step + 1] : cur;
    // Per token: the pair x[last + 2 tq], x[last + 2 tq + 1], and x[mid .. mid + 7] (16 bytes).
    uint32_t lastf[MT][2];
    uint4 mids[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        lastf[mt][hf] = q_word(mt, hf, cur.last + 2 * tq);
        mids[mt][hf] = *reinterpret_cast<const uint4*>(qrow + mt * mt_step + hf * hf_step + cur.mid);
      }
    mbarrier_wait(&full[buf], static_cast<uint32_t>((step / kBuffers) & 1));
    const __half* bt = bt0 + buf * b_size;
#pragma unroll
    for (int ks = 0; ks < f16_state_tiles_cfg::kRowsK / 16; ++ks) {
      wgmma_wait<kASlots - 1>();  // the group that last read this slot is complete
      uint32_t(&as)[MT][4] = a[ks % kASlots];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          // x[mid + G] x[last + l]: the product of two f16 values rounded once (the tile keeps x exactly).
          const int hf = q & 1;
          as[mt][q] = mul2<__half>(block_mid_pair(mids[mt][hf], 2 * ks + (q >> 1)), lastf[mt][hf]);
        }
      const uint64_t desc = kmajor_desc(bt + ks * 2 * kChunk, kChunk * sizeof(__half), 128);
      wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) wgmma_rs<__half, N>(acc[mt], as[mt], desc);
      wgmma_commit();
    }
    // The previous step's products are complete (the last wait above, kASlots <= 4): its buffer is
    // free.
    if (step >= 1 && (tid & 31) == 0) mbarrier_arrive(&empty[(step - 1) % kBuffers]);
    cur = next;
  }
  wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) wgmma_pin(acc[mt]);

  store_f16_outputs<T, E, MT>(P, at, acc, wg, token_unscale, col_unscale, token_g, token_rm, token_l);
}

}  // namespace expanse_cuda
