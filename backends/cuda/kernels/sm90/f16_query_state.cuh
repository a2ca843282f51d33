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
// A persistent CTA per SM takes the tiles in turn (tile = blockIdx.x + k gridDim.x) and has three
// roles, each looping over the same tiles:
// - two consumer warpgroups hold MT m64 tiles of tokens each (128 MT tokens, one chunk, all e, one
//   query head), form A, multiply and write the outputs;
// - the copy warp's first lane copies each step's ready B tile (one bulk copy) into a ring of
//   buffers, each with a "full" transaction barrier (the bytes have landed) and an "empty" one
//   (every consumer warp has finished its products of the tile), bulk_copy.cuh; it runs ahead
//   across tiles, so the next tile's first steps land during this tile's epilogue;
// - three loader warps stage each tile's context one tile ahead (double-buffered): the query tile
//   rewritten as f16, the column and token scales and the epilogue's per-token inputs; and the
//   intra-chunk term y, during the tile's own products, when it fits in shared memory.
// So the consumers only multiply and write: the prologue and epilogue of one CTA per tile (a DRAM
// round trip and a pass over the query tile each) had taken 0.19 of 0.67 ms (docs/performance.md).
// Earlier forms converted the state rows inside this kernel, four times per state at c = 1024 and
// on the critical path; the producers could not keep up.
#pragma once

#include "kernels/sm90/blocked_query_state.cuh"
#include "kernels/sm90/bulk_copy.cuh"
#include "kernels/sm90/f16_state_tiles.cuh"

namespace expanse_cuda {

namespace f16_query_state_cfg {
constexpr int kConsumerThreads = 256;  // two warpgroups (warps 0-7)
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kCopyWarp = kConsumerWarps;  // warp 8: its first lane copies the B tiles
constexpr int kLoaderThreads = 96;         // warps 9-11: the tile contexts
constexpr int kThreads = kConsumerThreads + 32 + kLoaderThreads;
constexpr int kLoaderBarrier = 1;  // the loader warps' named barrier
// Registers per thread (setmaxnreg): 168 at launch (384 threads); the copy and loader warpgroup
// gives part of its share to the consumers, whose accumulators, A slots and epilogue need them
// (at 168 each, the epilogue inside the tile loop spilled).
constexpr int kProducerRegisters = 96, kConsumerRegisters = 200;
static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <= 65536, "the register file");
// A fragments in flight per consumer warpgroup: four K slices (one step), so the warps form the
// next slices while the tensor cores still run three. (A divisor of the 4 slices per step, so that
// a slice's slot is the same in every step.)
constexpr int kASlots = 4;
// B tiles in flight: the launcher takes as many as fit in shared memory, up to kMaxBuffers (72 KB
// at e = 64; 12 and 16 measured the same as 8 on the H100).
constexpr int kMinBuffers = 4, kMaxBuffers = 8;
constexpr int kBarriers = 6;  // besides the ring's: context full and empty (x2), y full and empty

// A tile's context: the query tile (kTok rows of d + 8, type T, then f16), the state's column
// factors (e + 1, padded to a 16-byte multiple), and per token the factor that undoes its scale and
// the epilogue's inputs Gc, rowmax, l.
template <class T, int E, int MT>
constexpr size_t context_bytes(int d) {
  return size_t(128 * MT) * (d + 8) * sizeof(T) + (E + 4) * sizeof(float) + 4 * size_t(128 * MT) * sizeof(float);
}
// The intra-chunk term of a tile, f32 (see staged_y_col).
template <int E, int MT>
constexpr size_t y_tile_bytes() { return size_t(128 * MT) * E * sizeof(float); }
// The shared memory: the ring of B tiles, the barriers, the step table (each step's phi block as
// byte offsets into a query row), two tile contexts, the staged intra-chunk term.
template <int E>
__host__ __device__ constexpr size_t step_table_offset(int ring) {
  return size_t(ring) * f16_state_tiles_cfg::tile_elems<E>() * sizeof(__half) + (2 * ring + kBarriers) * sizeof(uint64_t);
}
template <int E>
__host__ __device__ constexpr size_t contexts_offset(int ring, int64_t steps) {
  return step_table_offset<E>(ring) + size_t(steps + 3) / 4 * 16;
}
// Where column block nt (8 floats) of row `row` of the staged y tile starts: blocks swapped by the
// row, so that the 8 rows of a warp's read fall in different banks.
template <int E>
__device__ __forceinline__ int staged_y_col(int row, int nt) { return (nt ^ (row & (min(8, E / 8) - 1))) * 8; }
}  // namespace f16_query_state_cfg

template <class T, int E, int MT>
constexpr size_t f16_query_state_smem(int d, int ring, int64_t steps, bool stage_y) {
  using namespace f16_query_state_cfg;
  return contexts_offset<E>(ring, steps) + 2 * context_bytes<T, E, MT>(d) + (stage_y ? y_tile_bytes<E, MT>() : 0);
}

template <class T>
struct query_context {
  T* q;
  float *col_unscale, *token_unscale, *token_g, *token_rm, *token_l;
};
template <class T, int E, int kTok>
__device__ __forceinline__ query_context<T> query_context_at(unsigned char* base, int d) {
  query_context<T> c;
  c.q = reinterpret_cast<T*>(base);
  c.col_unscale = reinterpret_cast<float*>(c.q + kTok * (d + 8));
  c.token_unscale = c.col_unscale + E + 4;
  c.token_g = c.token_unscale + kTok;
  c.token_rm = c.token_g + kTok;
  c.token_l = c.token_rm + kTok;
  return c;
}

// The query tile in f16: each token's row of x (kTok rows of d, type T) rewritten in place as f16
// times 2^s, with s such that |x 2^s| < 2^(15 / p) (so |phi| < 2^15), the column of ones at d as f16
// ones; token_unscale[row] = 2^(-p s), the factor that undoes the scale of phi. Eight lanes per row,
// 16 bytes each, by `workers` threads (whole warps; this one is `worker`). The exponents come from
// the bits (frexpf, ldexpf and a division by p per row had made this the loader's slowest part).
template <class T, int kTok>
__device__ __forceinline__ void scale_query_tile_to_f16(T* qs, int qs_stride, int d, int p, float* token_unscale,
                                                        int worker, int workers) {
  static_assert(kTok % 4 == 0, "whole warps of rows");
  const int sub = worker % 8, warp = worker / 32, warps = workers / 32;
  const int top = 15 / p, lim = min(60, 126 / p);  // |s| <= lim keeps 2^(p s) a normal float
  for (int row0 = warp * 4; row0 < kTok; row0 += warps * 4) {  // four rows per warp, the same trips
    const int row = row0 + (worker % 32) / 8;
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
    // mx < 2^ex (subnormal mx: ex = -126, and s is clamped to lim anyway).
    const int ex = ((__float_as_int(mx) >> 23) & 0xff) - 126;
    const int s = mx > 0.f && isfinite(mx) ? max(-lim, min(lim, top - ex)) : 0;
    const float f = pow2_of(s);
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
      token_unscale[row] = pow2_of(-p * s);
    }
  }
}

// Where the epilogue finds the intra-chunk term.
enum class intra_term { none, staged, global };

// The kernel's epilogue, for consumer warpgroup wg's MT m64 tiles of sums acc (column E: the
// denominator, held by tq = 0): undo the token and column scales (both powers of two), then
// decay, scale^p, the intra-chunk term and normalization, as mma_query_state.cuh's
// store_query_output, folded into one factor per token and one per column: o = acc c_col a_tok
// (+ y b_tok). The per-token inputs come from the tile's context; the intra-chunk term from the
// staged tile ys or through the read-only path (kY, chosen once per tile: per-output branches had
// made this 2700 instructions per warp); pairs of outputs are stored as one word.
template <intra_term kY, class T, int E, int MT>
__device__ __forceinline__ void store_f16_outputs(const mma_query_state_params& P, const query_tile& at,
                                                  float (&acc)[MT][E / 2 + 4], int wg, const query_context<T>& cx,
                                                  const float* ys) {
  constexpr int kNT = E / 8;
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3, g = lane >> 2, tq = lane & 3;
  T* const obase = static_cast<T*>(P.o) + at.batch * P.o_sb + at.qh * P.o_sh;
  const bool pairs = P.o_se == 1 && P.o_st % 2 == 0 && reinterpret_cast<uintptr_t>(obase) % 4 == 0;
  const float f = P.scale_p;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int local = (mt * 2 + wg) * 64 + wq * 16 + hf * 8 + g;
      const float tu = cx.token_unscale[local];
      const float den = __shfl_sync(0xffffffffu, acc[mt][4 * kNT + 2 * hf], lane & ~3) * (tu * cx.col_unscale[E]);
      if (local >= at.ntok) continue;
      const output_weights w = output_weights_of(den * f, cx.token_g[local], kY != intra_term::none,
                                                 cx.token_l[local], cx.token_rm[local], P.normalize != 0);
      const float a = tu * w.wn * f * w.r, b = w.wy * w.r;
      T* const out = obase + (at.tok0 + local) * P.o_st;
      const float* const yrow = P.y + at.batch * P.y_sb + (at.tok0 + local) * P.y_st + at.qh * P.y_sh;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int col = nt * 8 + 2 * tq;
        const float2 cu = *reinterpret_cast<const float2*>(cx.col_unscale + col);  // the columns' factors
        float v0 = acc[mt][4 * nt + 2 * hf] * cu.x * a, v1 = acc[mt][4 * nt + 2 * hf + 1] * cu.y * a;
        if constexpr (kY == intra_term::staged) {
          const float2 y = *reinterpret_cast<const float2*>(ys + local * E +
                                                            f16_query_state_cfg::staged_y_col<E>(local, nt) + 2 * tq);
          v0 += y.x * b;
          v1 += y.y * b;
        } else if constexpr (kY == intra_term::global) {
          v0 += __ldg(yrow + col * P.y_se) * b;
          v1 += __ldg(yrow + (col + 1) * P.y_se) * b;
        }
        if (pairs) {
          *reinterpret_cast<uint32_t*>(out + col) = pack2_f32<T>(v0, v1);
        } else {
          out[col * P.o_se] = from_f32<T>(v0);
          out[(col + 1) * P.o_se] = from_f32<T>(v1);
        }
      }
    }
}

// The copy warp's first lane: every step's B tile of every tile this CTA takes, in order, into the
// ring (step f of the CTA's whole sequence into buffer f % ring, once the consumers have released it).
template <int E, int MT>
__device__ __forceinline__ void copy_state_tiles(const mma_query_state_params& P, __half* ring, uint64_t* full,
                                                 uint64_t* empty) {
  const uint32_t ring_size = P.ring;
  constexpr int b_size = f16_state_tiles_cfg::tile_elems<E>();
  constexpr uint32_t kTileBytes = b_size * sizeof(__half);
  const int steps = static_cast<int>(P.blocks.count);
  ring_position at_ring;
  bool first_round = true;  // the buffers are free until the ring's first wrap
  for (int64_t tile = blockIdx.x; tile < P.tile_count; tile += gridDim.x) {
    const query_tile at = decode_query_tile(P, 128 * MT, tile);
    if (at.ntok <= 0) continue;
    const int64_t state = (at.batch * P.n + at.chunk) * P.h + at.kv;
    const __half* const tiles = P.f16_tiles + state * steps * b_size;
    for (int step = 0; step < steps; ++step) {
      const uint32_t buf = at_ring.buf;
      if (!first_round) mbarrier_wait(&empty[buf], at_ring.phase ^ 1);
      mbarrier_arrive_expect_tx(&full[buf], kTileBytes);
      bulk_copy_to_shared(ring + buf * b_size, tiles + step * b_size, kTileBytes, &full[buf]);
      if (at_ring.advance(ring_size)) first_round = false;
    }
  }
}

// The loader warps (thread `lt` of kLoaderThreads): for each tile, once the consumers have released
// its context buffer (two tiles back), copy the query tile, column scales and per-token inputs by
// cp.async (tokens past ntok read as zeros), rewrite the query tile as f16, and arrive on the
// buffer's "full" barrier; then, once the consumers have finished the previous tile's epilogue,
// start the copies of the tile's intra-chunk term into ys, which arrive on y_full when they land.
template <class T, int E, int MT>
__device__ __forceinline__ void load_tile_contexts(const mma_query_state_params& P, unsigned char* contexts,
                                                   size_t context_size, uint64_t* ctx_full, uint64_t* ctx_empty,
                                                   float* ys, uint64_t* y_full, uint64_t* y_empty, int lt) {
  using namespace f16_query_state_cfg;
  constexpr int kTok = 128 * MT;
  const int d = P.d, qs_stride = d + 8;
  const int chunks = d / 8, rows_step = kLoaderThreads / chunks, c8_step = kLoaderThreads % chunks;
  int local = 0;
  for (int64_t tile = blockIdx.x; tile < P.tile_count; tile += gridDim.x) {
    const query_tile at = decode_query_tile(P, kTok, tile);
    if (at.ntok <= 0) continue;
    const int64_t qh = at.qh, batch = at.batch, tok0 = at.tok0, ntok = at.ntok;
    const int64_t state = (batch * P.n + at.chunk) * P.h + at.kv;
    const int b = local & 1;
    if (local >= 2) mbarrier_wait(&ctx_empty[b], static_cast<uint32_t>((local / 2 - 1) & 1));
    const query_context<T> cx = query_context_at<T, E, kTok>(contexts + b * context_size, d);
    const T* const qbase = static_cast<const T*>(P.q) + batch * P.q_sb + qh * P.q_sh;
    // 16-byte pieces c8 of rows `row`, kLoaderThreads apart (no division per piece: d is a run-time value).
    for (int row = lt / chunks, c8 = lt % chunks; row < kTok; row += rows_step, c8 += c8_step) {
      if (c8 >= chunks) c8 -= chunks, ++row;
      if (row >= kTok) break;
      copy_async<16>(cx.q + row * qs_stride + c8 * 8, qbase + (tok0 + min(int64_t(row), ntok - 1)) * P.q_st + c8 * 8,
                     row < ntok);
    }
    for (int c = lt; c <= E; c += kLoaderThreads)
      copy_async<4>(cx.col_unscale + c, P.state_scales + state * (E + 1) + c, true);
    for (int row = lt; row < kTok; row += kLoaderThreads) {
      const int64_t i = tok0 + min(int64_t(row), ntok - 1);
      copy_async<4>(cx.token_g + row, P.g.Gc ? P.g.Gc + at.bh * P.t + i : P.state_scales, P.g.Gc && row < ntok);
      if (P.y) {
        copy_async<4>(cx.token_rm + row, P.rowmax + batch * P.r_sb + i * P.r_st + qh * P.r_sh, row < ntok);
        copy_async<4>(cx.token_l + row, P.l ? P.l + batch * P.l_sb + i * P.l_st + qh * P.l_sh : P.state_scales,
                      P.l && row < ntok);
      }
    }
    copy_async_commit();
    copy_async_wait<0>();
    // 1 / scale, exactly (powers of two; each thread inverts the scales it copied): the epilogue
    // multiplies where a division cost ten instructions per output.
    for (int c = lt; c <= E; c += kLoaderThreads) cx.col_unscale[c] = 1.f / cx.col_unscale[c];
    named_barrier_sync(kLoaderBarrier, kLoaderThreads);  // every loader's rows have landed
    scale_query_tile_to_f16<T, kTok>(cx.q, qs_stride, d, P.p, cx.token_unscale, lt, kLoaderThreads);
    mbarrier_arrive(&ctx_full[b]);
    if (ys != nullptr) {
      if (local >= 1) mbarrier_wait(y_empty, static_cast<uint32_t>((local - 1) & 1));
      const float* const ybase = P.y + batch * P.y_sb + qh * P.y_sh;
      for (int vi = lt; vi < kTok * E / 4; vi += kLoaderThreads) {
        const int row = vi / (E / 4), piece = vi % (E / 4);
        copy_async<16>(ys + row * E + staged_y_col<E>(row, piece / 2) + (piece % 2) * 4,
                       ybase + (tok0 + min(int64_t(row), ntok - 1)) * P.y_st + piece * 4, row < ntok);
      }
      copy_async_arrive(y_full);
    }
    ++local;
  }
}

template <class T, int E, int MT>
__global__ void __launch_bounds__(f16_query_state_cfg::kThreads, 1) f16_query_state_kernel(mma_query_state_params P) {
  using namespace f16_query_state_cfg;
  constexpr int kTok = 128 * MT;
  constexpr int N = E + 8;
  const uint32_t ring_size = P.ring;
  constexpr int kChunk = f16_state_tiles_cfg::chunk_elems<E>();
  constexpr int b_size = f16_state_tiles_cfg::tile_elems<E>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = P.d, qs_stride = d + 8;
  // The ring of B tiles, the barriers, the step table, two tile contexts, the staged intra-chunk term.
  __half* const bt0 = reinterpret_cast<__half*>(smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(bt0 + ring_size * b_size);
  uint64_t* const empty = full + ring_size;
  uint64_t* const ctx_full = empty + ring_size;  // [2]
  uint64_t* const ctx_empty = ctx_full + 2;  // [2]
  uint64_t* const y_full = ctx_empty + 2;
  uint64_t* const y_empty = y_full + 1;
  uint32_t* const step_table = reinterpret_cast<uint32_t*>(smem_raw + step_table_offset<E>(ring_size));
  unsigned char* const contexts = smem_raw + contexts_offset<E>(ring_size, P.blocks.count);
  const size_t context_size = context_bytes<T, E, MT>(d);
  float* const ys = P.stage_y ? reinterpret_cast<float*>(contexts + 2 * context_size) : nullptr;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  // Step s multiplies phi block s: its mid and last features as byte offsets in a query row.
  for (int64_t s = tid; s < P.blocks.count; s += kThreads) {
    const phi_block blk = P.blocks.block[s];
    step_table[s] = uint32_t(blk.mid) * 2 << 16 | uint32_t(blk.last) * 2;
  }
  if (tid == 0) {
    for (uint32_t b = 0; b < ring_size; ++b) {
      mbarrier_init(&full[b], 1);
      mbarrier_init(&empty[b], kConsumerWarps);
    }
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(&ctx_full[b], kLoaderThreads);
      mbarrier_init(&ctx_empty[b], kConsumerWarps);
    }
    mbarrier_init(y_full, kLoaderThreads);
    mbarrier_init(y_empty, kConsumerWarps);
    mbarrier_init_fence();
  }
  __syncthreads();  // the barriers; the roles meet only at them from here on
  if (warp >= kConsumerWarps) {
    warpgroup_registers_lower<kProducerRegisters>();
    if (warp == kCopyWarp) {
      if (lane == 0) copy_state_tiles<E, MT>(P, bt0, full, empty);
    } else {
      load_tile_contexts<T, E, MT>(P, contexts, context_size, ctx_full, ctx_empty, ys, y_full, y_empty,
                                   tid - (kConsumerThreads + 32));
    }
    return;
  }
  warpgroup_registers_raise<kConsumerRegisters>();

  // Consumers: warpgroup wg holds rows g and g + 8 (hf) of its warp's 16 in each of its m64 tiles.
  // The step loop finds its addresses by adding to ones set up per tile: the step's offsets from
  // the step table, the descriptors from the ring's first.
  const int wg = warp >> 2, wq = warp & 3;
  const int steps = static_cast<int>(P.blocks.count);
  const uint32_t row_bytes = (wg * 64 + wq * 16 + g) * qs_stride * 2, hf_bytes = 8 * qs_stride * 2,
                 mt_bytes = 128 * qs_stride * 2;
  const uint64_t desc0 = kmajor_desc(bt0, kChunk * sizeof(__half), 128);
  constexpr uint32_t kTileDesc = b_size * sizeof(__half) / 16, kSliceDesc = 2 * kChunk * sizeof(__half) / 16;
  ring_position at_ring;  // of this step's B tile, over the steps of all tiles so far
  uint32_t prev_buf = 0;  // the previous step's buffer
  int local = 0;
  for (int64_t tile = blockIdx.x; tile < P.tile_count; tile += gridDim.x) {
    if (decode_query_tile(P, kTok, tile).ntok <= 0) continue;
    const int b = local & 1;
    mbarrier_wait(&ctx_full[b], (local / 2) & 1);
    // (The tile's coordinates and context are found again for the epilogue: registers are short.)
    const unsigned char* row[MT][2];  // this lane's token rows g (hf = 0) and g + 8 of m64 tile mt
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        row[mt][hf] = reinterpret_cast<const unsigned char*>(query_context_at<T, E, kTok>(contexts + b * context_size, d).q) +
                      row_bytes + mt * mt_bytes + hf * hf_bytes + 4 * tq;

    float acc[MT][N / 2];
    wgmma_zero(acc);
    // The A fragments of K slice ks (slot ks % kASlots) are read by that slice's products (one wgmma
    // group each) until they complete; the slot is rewritten after waiting for that group only.
    uint32_t a[kASlots][MT][4];
    for (int step = 0; step < steps; ++step) {
      const uint32_t buf = at_ring.buf;
      // Per token: the pair x[last + 2 tq], x[last + 2 tq + 1], and x[mid .. mid + 7] (16 bytes).
      const uint32_t offsets = step_table[step];
      const uint32_t last = offsets & 0xffff, mid = (offsets >> 16) - 4 * tq;
      uint32_t lastf[MT][2];
      uint4 mids[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          lastf[mt][hf] = *reinterpret_cast<const uint32_t*>(row[mt][hf] + last);
          mids[mt][hf] = *reinterpret_cast<const uint4*>(row[mt][hf] + mid);
        }
      mbarrier_wait(&full[buf], at_ring.phase);
      const uint64_t step_desc = desc0 + buf * kTileDesc;
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
        wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) wgmma_rs<__half, N>(acc[mt], as[mt], step_desc + ks * kSliceDesc);
        wgmma_commit();
      }
      // The previous step's products are complete (the last wait above, kASlots <= 4): its buffer
      // is free.
      if (step >= 1 && lane == 0) mbarrier_arrive(&empty[prev_buf]);
      prev_buf = buf;
      at_ring.advance(ring_size);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) wgmma_pin(acc[mt]);
    if (lane == 0) mbarrier_arrive(&empty[prev_buf]);  // the tile's last step
    if (ys != nullptr) mbarrier_wait(y_full, local & 1);
    {
      const query_tile at = decode_query_tile(P, kTok, tile);
      const query_context<T> cx = query_context_at<T, E, kTok>(contexts + b * context_size, d);
      if (ys != nullptr) store_f16_outputs<intra_term::staged, T, E, MT>(P, at, acc, wg, cx, ys);
      else if (P.y != nullptr) store_f16_outputs<intra_term::global, T, E, MT>(P, at, acc, wg, cx, ys);
      else store_f16_outputs<intra_term::none, T, E, MT>(P, at, acc, wg, cx, ys);
    }
    __syncwarp();  // the warp's reads of the context and of ys are done
    if (lane == 0) {
      mbarrier_arrive(&ctx_empty[b]);
      mbarrier_arrive(y_empty);  // (unused without a staged term: no one waits on it)
    }
    ++local;
  }
}

}  // namespace expanse_cuda
