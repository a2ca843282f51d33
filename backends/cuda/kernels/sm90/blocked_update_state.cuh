// update_state as expand-MMA on Hopper (wgmma, sm_90a) for expansions in phi blocks (kernels/common.cuh),
// warp-specialized and persistent:
//   S_m[r, :] = sum_j A[r, j] v_j,  z_m[r] = sum_j A[r, j],  A[r, j] = phi_r(k_j) w_j,  w_j = exp(A_m - Gc_j),
// a GEMM with M = rows of phi, N = e + 8 (the e columns of v and an 8-wide tile whose first column is
// ones, giving z), K = the chunk's tokens. Each m64 tile of a warpgroup is one phi block, whose row
// 8 G + l is
//   x[fixed0] x[fixed1] x[mid + G] x[last + l];
// a lane's two fragment rows (g and g + 8) are rows (G = 2 wq, l = g) and (G = 2 wq + 1, l = g), so
// both multiply the same key feature last + g, and the mid feature is the same for the 8 lanes g of
// a row half (a broadcast read). The key tile stores each feature's 64 tokens in the order the lanes
// use them (tq's 16 tokens contiguous): one 16-byte read gives 4 token pairs. The gates are a row of
// the key tile and multiply the last factor, so A is formed gated in registers (but for kSplit).
//
// B is the value rows exactly as copied (but for kSplit): N-major with the hardware's swizzle
// (wgmma.cuh, nmajor_swizzled_desc), next to a constant tile of ones for z. Nothing converts the values.
//
// A tile is 4 phi blocks (256 rows) x all e columns over one chunk of one head, in K steps of 64
// tokens. One CTA per SM takes the tiles in turn (tile = blockIdx.x + k gridDim.x); its roles loop
// over the same tiles and steps:
// - the producer warpgroup (two for kSplit) copies each step's value rows into a step buffer
//   (kSplit: into the raw stage), and its key rows and token gates into a raw stage, by cp.async
//   (raw_stages - 1 steps ahead, across tiles); then per step it transposes the key rows into the
//   buffer's key tile (ldmatrix.trans, 16-byte stores) and writes the gates, and arrives on the
//   buffer's "full" barrier (bulk_copy.cuh);
// - two consumer warpgroups (2 m64 tiles each) form A from the key tile, multiply, release the
//   buffer on its "empty" barrier, and write the tile's rows of S and z.
// kSplit (p = 2; the tensor-core power_attention_backward's forward sweep and cotangent states, whose
// state terms cancel and magnify a b16 rounding): the gate goes with the values, B = w_j v_j split
// into b16 hi + lo by the producer (two value tiles per step, formed once for both warpgroups), and
// A = phi(k_j) without it, whose p = 2 rows x_a x_b are exactly hi + lo (a product of two b16 values
// has twice their significand: mul2_split, 3 packed instructions per register pair). Three products
// per slice, A_hi B_hi + A_hi B_lo + A_lo B_hi (A_lo B_lo is under 2^-18 of the product). With the
// gate on A instead (f32 gate times the last factor, split, then times the mid factor: two products
// per slice) the consumers issued 503 instructions per step and the kernel was bound by issue
// (tensor pipe 39% busy); this form issues 210, the tensor pipe is 61% busy, and the time is the same
// (1.1 ms at P1 t = 65536): the consumers wait for the producer's B (docs/performance.md, lesson
// 15). A second producer warpgroup (half the rows per thread) took it to 1.07 ms, the tensor pipe 65%
// busy; B's lo part stored negated (16 fewer producer instructions per step) gained nothing. With
// P.weight each token's weight takes the place of exp(A - Gc_j).
//
// History (docs/performance.md): one CTA per tile with every warp staging and then multiplying, a
// CTA barrier per step, ran at 220 TFLOP/s at P1; the same work split into producer and consumers
// ran at the same speed, the producer (key transposition, value gating and conversion: 190
// instructions per thread and step) being the bottleneck.
#pragma once

#include "kernels/sm90/bulk_copy.cuh"
#include "kernels/sm90/wgmma_update_state.cuh"

namespace expanse_cuda {

namespace blocked_update_state_cfg {
constexpr int kBlocksPerCta = 4;       // phi blocks per tile: 2 consumer warpgroups x 2 m64 tiles
constexpr int kConsumerThreads = 256;  // warps 0-7
constexpr int kConsumerWarps = kConsumerThreads / 32;
// The producer warps (8 on): one warpgroup, two for kSplit (which forms B).
template <bool kSplit> constexpr int producer_threads() { return kSplit ? 256 : 128; }
template <bool kSplit> constexpr int block_threads() { return kConsumerThreads + producer_threads<kSplit>(); }
constexpr int kProducerBarrier = 1;  // the producer warps' named barrier
constexpr int kTok = wgmma_update_state_cfg::kTok, kTokPad = wgmma_update_state_cfg::kTokPad;
// A fragments in flight per consumer warpgroup: the 4 K slices of a step, so the warps form the
// next step's slices while the tensor cores still run three of this one.
constexpr int kASlots = 4;
// Registers per thread (setmaxnreg; 168 at launch for 384 threads, 128 for kSplit's 512): the
// consumers' accumulators are 2 x (e + 8) / 2 per thread, so e = 128 takes more from the producers;
// kSplit (e = 64) keeps 192 for its split A fragments.
template <int E, bool kSplit> constexpr int consumer_registers() { return kSplit ? 192 : E == 128 ? 224 : 200; }
template <int E, bool kSplit> constexpr int producer_registers() { return kSplit ? 64 : E == 128 ? 56 : 96; }
static_assert(128 * producer_registers<128, false>() + kConsumerThreads * consumer_registers<128, false>() <= 384 * 168, "registers");
static_assert(128 * producer_registers<64, false>() + kConsumerThreads * consumer_registers<64, false>() <= 384 * 168, "registers");
static_assert(256 * producer_registers<64, true>() + kConsumerThreads * consumer_registers<64, true>() <= 512 * 128, "registers");

// The word (pair of tokens) that holds tokens 2 sp, 2 sp + 1 of a step in a feature row of the key
// tile: lane tq's tokens 16 ks + 8 h + 2 tq (+1) lie at words 8 tq + 2 ks + h.
__device__ __forceinline__ int token_pair_word(int sp) { return (sp % 4) * 8 + (sp / 8) * 2 + (sp % 8) / 4; }

// The value rows of a step (B): rows of min(2e, 128) bytes with the hardware's swizzle, in blocks
// of 64 rows, one per 64 (or 32) columns, then one block whose first column is ones (z).
template <class T, int E> constexpr int value_row_bytes() { return E * int(sizeof(T)) < 128 ? E * int(sizeof(T)) : 128; }
template <class T, int E> constexpr int value_block_bytes() { return kTok * value_row_bytes<T, E>(); }
template <class T, int E> constexpr int value_blocks() { return E * int(sizeof(T)) / value_row_bytes<T, E>(); }
// A step buffer: the value blocks and the ones block (kSplit: the gated values' hi part and its
// block of weights, then their lo part likewise), then the key tile [DH + 2][kTokPad] (row DH is
// ones: the fixed factors past p point there; row DH + 1 holds the gates, but for kSplit), rounded up
// to 1024 bytes (the swizzle's alignment).
template <int DH> constexpr int key_tile_elems() { return (DH + 2) * kTokPad; }
template <class T, int E> constexpr int value_part_bytes() { return (value_blocks<T, E>() + 1) * value_block_bytes<T, E>(); }
template <class T, int E, bool kSplit>
constexpr int key_tile_offset() { return (kSplit ? 2 : 1) * value_part_bytes<T, E>(); }
template <class T, int DH, int E, bool kSplit = false>
constexpr int step_buffer_bytes() {
  return (key_tile_offset<T, E, kSplit>() + key_tile_elems<DH>() * int(sizeof(T)) + 1023) / 1024 * 1024;
}
// A raw stage: the step's key rows [64][DH] (16-byte chunk c of row s at key_raw_offset), kSplit:
// then its value rows [64][E] likewise, then the tokens' Gc (f32; or their weights), kZWeight: then
// their z weights (P.z_weight).
template <class T, int DH>
constexpr int raw_value_offset() { return kTok * DH * int(sizeof(T)); }
template <class T, int DH, int E, bool kSplit>
constexpr int raw_gate_offset() { return raw_value_offset<T, DH>() + (kSplit ? kTok * E * int(sizeof(T)) : 0); }
template <class T, int DH, int E, bool kSplit, bool kZWeight = false>
constexpr int raw_stage_bytes() { return raw_gate_offset<T, DH, E, kSplit>() + (kZWeight ? 2 : 1) * kTok * 4; }
// Rings: the copies run raw_stages - 1 steps ahead, into a raw stage and a step buffer each; there
// are more step buffers than raw stages, so that the producer converts the next step while the
// consumers multiply this one (with as many, it would wait for the buffer of the step before this one,
// which the consumers release only after issuing this step's products: they waited for it in turn,
// 0.93 ms at P1). The launcher takes the deepest rings that fit: 5 raw stages and 7 buffers at P1
// (227 KB; 1% faster than 4 and 6, measured).
constexpr int kMinRawStages = 3, kMaxRawStages = 5, kExtraBuffers = 2;
}  // namespace blocked_update_state_cfg

// Shared memory: 1024 bytes of alignment slack, the step buffers, the raw stages, 2 barriers per buffer.
template <class T, int DH, int E, bool kSplit = false, bool kZWeight = false>
constexpr size_t blocked_update_state_smem(int buffers, int raw_stages) {
  using namespace blocked_update_state_cfg;
  return 1024 + size_t(buffers) * (step_buffer_bytes<T, DH, E, kSplit>() + 2 * sizeof(uint64_t)) +
         size_t(raw_stages) * raw_stage_bytes<T, DH, E, kSplit, kZWeight>();
}

// Byte offset of 16-byte chunk c of token row s in a raw key stage (rows of 2 DH bytes; also the
// raw value rows, with E for DH): the chunk XOR the row (the row pair at DH = 32), so that the 8 rows
// of an ldmatrix fall in different banks.
template <class T, int DH>
__device__ __forceinline__ int key_raw_offset(int s, int c) {
  const int x = DH * sizeof(T) < 128 ? (s >> 1) & 3 : s & 7;
  return s * DH * int(sizeof(T)) + (c ^ x) * 16;
}

// Where a tile lies: its block group, head, chunk, tokens and the chunk's total log gate.
struct update_tile {
  int row_tile;
  int64_t batch, head, chunk, bh, first, len;
  int steps;
  float total_log2;  // the chunk's total log gate, times log2(e)
};
__device__ __forceinline__ update_tile decode_update_tile(const mma_update_state_params& P, int64_t tile) {
  const cta_coords at = decode_cta(P.row_tiles, P.h, P.n, tile);
  update_tile u;
  u.row_tile = at.tile;
  u.batch = at.batch, u.head = at.head, u.chunk = at.chunk;
  u.bh = at.batch * P.h + at.head;
  u.first = at.chunk * P.c;
  u.len = min(P.c, P.t - u.first);
  u.steps = static_cast<int>((u.len + blocked_update_state_cfg::kTok - 1) / blocked_update_state_cfg::kTok);
  u.total_log2 = P.g.chunk_total(u.bh, P.n, u.chunk) * kLog2e;
  return u;
}

// A walk over the (tile, step) pairs this CTA takes, in order.
struct tile_step_walk {
  int64_t tile;
  int step = 0;
  update_tile at;
  __device__ __forceinline__ tile_step_walk(const mma_update_state_params& P) : tile(blockIdx.x) {
    if (tile < P.tile_count) at = decode_update_tile(P, tile);
  }
  __device__ __forceinline__ bool done(const mma_update_state_params& P) const { return tile >= P.tile_count; }
  __device__ __forceinline__ void advance(const mma_update_state_params& P) {
    if (++step < at.steps) return;
    step = 0;
    tile += gridDim.x;
    if (tile < P.tile_count) at = decode_update_tile(P, tile);
  }
};

// The producer warps (thread pt of producer_threads<kSplit>()).
template <class T, int DH, int E, bool kSplit, bool kZWeight>
__device__ __forceinline__ void produce_update_steps(const mma_update_state_params& P, unsigned char* bufs,
                                                     unsigned char* raws, uint64_t* full, uint64_t* empty, int pt) {
  using namespace blocked_update_state_cfg;
  constexpr int d = DH;
  constexpr int kKeyChunks = d / 8, kValChunks = E / 8;  // 16-byte chunks per row
  constexpr int kRawBytes = raw_stage_bytes<T, d, E, kSplit, kZWeight>();
  constexpr int kBufBytes = step_buffer_bytes<T, d, E, kSplit>();
  constexpr int kVRow = value_row_bytes<T, E>(), kVBlock = value_block_bytes<T, E>(), kVChunks = kVRow / 16;
  constexpr int kKeyTile = key_tile_offset<T, E, kSplit>();  // byte offset of the key tile in a buffer
  constexpr int kValRaw = raw_value_offset<T, d>(), kGcOffset = raw_gate_offset<T, d, E, kSplit>();
  const uint32_t buffers = P.ring, raw_stages = P.raw_stages;

  // Copies: two threads per token row (four for kSplit), each taking its share of the row's 16-byte
  // chunks, consecutive: one source address per thread and row, the chunks at immediate offsets
  // from it. The source advances by one step's rows per step (recomputed when a tile starts); the
  // destinations are the same every step. (Chunks 16 rows apart, each at its own 64-bit address,
  // had cost twice the instructions, and waits for the address registers to be read.)
  constexpr int kProducerThreads = producer_threads<kSplit>(), kRowThreads = kProducerThreads / kTok;
  constexpr int kKeyCopies = kKeyChunks / kRowThreads, kValCopies = kValChunks / kRowThreads;
  static_assert(kKeyCopies * kRowThreads == kKeyChunks && kValCopies * kRowThreads == kValChunks, "whole shares");
  const int row = pt / kRowThreads, kc0 = (pt % kRowThreads) * kKeyCopies, vc0 = (pt % kRowThreads) * kValCopies;
  // vdst: a value chunk's place in the step buffer (kSplit: its hi part's; vraw its raw place).
  int kdst[kKeyCopies], vdst[kValCopies], vraw[kValCopies];
#pragma unroll
  for (int j = 0; j < kKeyCopies; ++j) kdst[j] = key_raw_offset<T, d>(row, kc0 + j);
#pragma unroll
  for (int j = 0; j < kValCopies; ++j) {
    const int c = vc0 + j;
    vdst[j] = (c / kVChunks) * kVBlock + int(swizzled_row_offset(row, c % kVChunks, kVRow));
    vraw[j] = kValRaw + key_raw_offset<T, E>(row, c);
  }
  const T *ksrc = nullptr, *vsrc = nullptr;
  const int64_t k_step = int64_t(kTok) * P.k_st, v_step = int64_t(kTok) * P.v_st;
  // The walk's step: keys and gates into raw stage `raw`, values into step buffer `buf` (kSplit:
  // into the raw stage, to be gated; zeros past the chunk: those sources are not read), committed as
  // one group (an empty group past the last tile, so that every step commits one).
  auto issue_step = [&](const tile_step_walk& w, unsigned char* raw, unsigned char* buf) {
    if (!w.done(P)) {
      if (w.step == 0) {
        ksrc = static_cast<const T*>(P.k) + w.at.batch * P.k_sb + w.at.head * P.k_sh + (w.at.first + row) * P.k_st + kc0 * 8;
        vsrc = static_cast<const T*>(P.v) + w.at.batch * P.v_sb + w.at.head * P.v_sh + (w.at.first + row) * P.v_st + vc0 * 8;
      } else {
        ksrc += k_step;
        vsrc += v_step;
      }
      const int s0 = w.step * kTok;
      const int64_t left = w.at.len - s0;
      const bool in = row < left;
#pragma unroll
      for (int j = 0; j < kKeyCopies; ++j) copy_async<16>(raw + kdst[j], ksrc + 8 * j, in);
#pragma unroll
      for (int j = 0; j < kValCopies; ++j) copy_async<16>(kSplit ? raw + vraw[j] : buf + vdst[j], vsrc + 8 * j, in);
      if (pt >= kProducerThreads - kTok) {  // the last warps: the first one computes the gates
        const int s = pt - (kProducerThreads - kTok);
        const bool weighted = kSplit && P.weight != nullptr;
        const bool gin = (weighted || P.g.Gc != nullptr) && s < left;
        const int64_t token = (w.at.batch * P.t + w.at.first + s0 + s) * P.h + w.at.head;  // weighted
        const float* src = !gin ? nullptr : weighted ? P.weight + token : P.g.Gc + w.at.bh * P.t + w.at.first + s0 + s;
        copy_async<4>(raw + kGcOffset + 4 * s, src, gin);
        if constexpr (kZWeight) copy_async<4>(raw + kGcOffset + 4 * (kTok + s), gin ? P.z_weight + token : nullptr, gin);
      }
    }
    copy_async_commit();
  };

  // The key tile of a step: 8 tokens x 8 features per ldmatrix matrix, transposed, four matrices
  // (token blocks 4 h .. 4 h + 3) give lane (g, tq) the words 8 tq + 4 h .. + 3 of feature row
  // 8 c8 + g: one 16-byte store. Items (c8, h), d / 4 of them, over the producer warps.
  constexpr int kProducerWarps = kProducerThreads / 32;
  constexpr int kKeyItems = d / 8 * 2, kWarpItems = (kKeyItems + kProducerWarps - 1) / kProducerWarps;
  const int warp = pt / 32, lane = pt % 32;
  auto convert_step = [&](const tile_step_walk& w, const unsigned char* raw, unsigned char* buf) {
    T* const kb = reinterpret_cast<T*>(buf + kKeyTile);
#pragma unroll
    for (int i = 0; i < kWarpItems; ++i) {
      const int item = warp + kProducerWarps * i;
      if (kKeyItems % kProducerWarps != 0 && item >= kKeyItems) break;
      const int c8 = item / 2, h = item % 2;
      uint32_t r[4];
      ldmatrix_x4_trans(r, raw + key_raw_offset<T, d>(32 * h + lane, c8));  // lane: row lane % 8 of matrix lane / 8
      store_shared_16(kb + (8 * c8 + lane / 4) * kTokPad + 16 * (lane % 4) + 8 * h, make_uint4(r[0], r[1], r[2], r[3]));
    }
    const int left = static_cast<int>(min(w.at.len - int64_t(w.step) * kTok, int64_t(kTok)));
    if constexpr (kSplit) {
      // This thread's token row: its weight (exp(A - Gc_s) by exp2f, whose 2 ulp stay under the
      // split's 2^-17; or P.weight's; 0 past the chunk) split into hi + lo, the thread's value chunks
      // times it as hi + lo pairs (mul2_split), and the weight itself (or P.z_weight's) in the ones
      // block's column 0.
      const float gc = reinterpret_cast<const float*>(raw + kGcOffset)[row];
      float wt = P.weight != nullptr ? gc : P.g.Gc != nullptr ? exp2f(fmaf(-gc, kLog2e, w.at.total_log2)) : 1.f;
      if (row >= left) wt = 0.f;
      uint32_t w_hi, w_lo;
      split2_f32<T>(wt, wt, w_hi, w_lo);
      if (pt % kRowThreads == 0) {  // before the values: the z weight's registers are free for them
        uint32_t z_hi = w_hi, z_lo = w_lo;
        if constexpr (kZWeight) {
          const float zw = row < left ? reinterpret_cast<const float*>(raw + kGcOffset)[kTok + row] : 0.f;
          split2_f32<T>(zw, zw, z_hi, z_lo);
        }
        const int ones = value_blocks<T, E>() * kVBlock + int(swizzled_row_offset(row, 0, kVRow));
        store_shared_16(buf + ones, make_uint4(z_hi & 0xffffu, 0, 0, 0));
        store_shared_16(buf + value_part_bytes<T, E>() + ones, make_uint4(z_lo & 0xffffu, 0, 0, 0));
      }
#pragma unroll
      for (int j = 0; j < kValCopies; ++j) {
        const uint4 v = load_shared_16(raw + vraw[j]);
        uint4 hi, lo;
        mul2_split<T>(v.x, w_hi, w_lo, hi.x, lo.x);
        mul2_split<T>(v.y, w_hi, w_lo, hi.y, lo.y);
        mul2_split<T>(v.z, w_hi, w_lo, hi.z, lo.z);
        mul2_split<T>(v.w, w_hi, w_lo, hi.w, lo.w);
        store_shared_16(buf + vdst[j], hi);
        store_shared_16(buf + value_part_bytes<T, E>() + vdst[j], lo);
      }
    } else if (pt < kTok / 2) {
      // Gates exp(A - Gc_s), 0 past the chunk, as token pairs in row d + 1, by the first warp (8
      // lanes in each warp measured slower: every warp then issued the whole sequence). (A - Gc_s <=
      // 0: ex2 without exp's range handling; gates under 2^-126 flush to 0.)
      float w0 = 1.f, w1 = 1.f;
      const float2 gc = reinterpret_cast<const float2*>(raw + kGcOffset)[pt];
      if (P.g.Gc != nullptr) {
        w0 = fast_exp2(fmaf(-gc.x, kLog2e, w.at.total_log2));
        w1 = fast_exp2(fmaf(-gc.y, kLog2e, w.at.total_log2));
      }
      w0 = 2 * pt < left ? w0 : 0.f;
      w1 = 2 * pt + 1 < left ? w1 : 0.f;
      reinterpret_cast<uint32_t*>(kb + (d + 1) * kTokPad)[token_pair_word(pt)] = pack2_f32<T>(w0, w1);
    }
  };

  tile_step_walk ahead(P), at(P);
  ring_position copy_raw, copy_buf, convert_raw, convert_buf;
  bool first_round = true;  // the step buffers are free until the copies wrap their ring
  auto issue_next = [&] {
    issue_step(ahead, raws + copy_raw.buf * kRawBytes, bufs + copy_buf.buf * kBufBytes);
    ahead.advance(P);
    copy_raw.advance(raw_stages);
    if (copy_buf.advance(buffers)) first_round = false;
  };
  for (uint32_t i = 0; i + 1 < raw_stages; ++i) issue_next();
  for (; !at.done(P); at.advance(P)) {
    // This step's copies (the later ones may still run).
    if (raw_stages == 5) copy_async_wait<3>();
    else if (raw_stages == 4) copy_async_wait<2>();
    else copy_async_wait<1>();
    // Every producer's copies of this step have landed, and every producer has converted the
    // previous step, whose raw stage the next copies reuse.
    named_barrier_sync(kProducerBarrier, kProducerThreads);
    convert_step(at, raws + convert_raw.buf * kRawBytes, bufs + convert_buf.buf * kBufBytes);
    fence_async_shared();  // the values, for the tensor cores
    mbarrier_arrive(&full[convert_buf.buf]);
    convert_raw.advance(raw_stages);
    convert_buf.advance(buffers);
    // The step raw_stages - 1 ahead, once the consumers have released its buffer.
    if (!first_round && !ahead.done(P)) mbarrier_wait(&empty[copy_buf.buf], copy_buf.phase ^ 1);
    issue_next();
  }
  copy_async_wait<0>();
}

// PM: 2 for p = 2 (fixed factors ignored), 4 for p = 3, 4 (fixed factors past p read the row of ones).
// kZWeight (kSplit only): z's sums take P.z_weight in place of the weights (a raw stage holds both).
template <class T, int DH, int E, int PM, bool kSplit = false, bool kZWeight = false>
__global__ void __launch_bounds__(blocked_update_state_cfg::block_threads<kSplit>(), 1)
    blocked_update_state_kernel(mma_update_state_params P) {
  using namespace blocked_update_state_cfg;
  static_assert(!kSplit || PM == 2, "the split form takes p = 2");
  static_assert(kSplit || !kZWeight, "z's own weights come with the split form");
  constexpr int kThreads = block_threads<kSplit>(), kProducerThreads = producer_threads<kSplit>();
  constexpr int N = E + 8;    // e columns + the z tile
  constexpr int kNT = E / 8;  // 8-column blocks of v; block kNT is the z tile
  constexpr int d = DH;
  constexpr int kBufBytes = step_buffer_bytes<T, d, E, kSplit>();
  constexpr int kVRow = value_row_bytes<T, E>(), kVBlock = value_block_bytes<T, E>(), kVBlocks = value_blocks<T, E>();
  constexpr int kKeyTile = key_tile_offset<T, E, kSplit>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t buffers = P.ring;
  // The swizzled value blocks need 1024-byte alignment.
  // (Said to the compiler too: without it, it splits the 16-byte shared accesses into 4-byte ones.)
  unsigned char* const bufs = static_cast<unsigned char*>(
      __builtin_assume_aligned(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024), 1024));
  unsigned char* const raws = bufs + buffers * kBufBytes;
  uint64_t* const full = reinterpret_cast<uint64_t*>(raws + P.raw_stages * raw_stage_bytes<T, d, E, kSplit, kZWeight>());
  uint64_t* const empty = full + buffers;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  // Once: the ones block (z) and the key tile's row of ones, in every buffer.
  for (uint32_t b = 0; b < buffers; ++b) {
    unsigned char* const buf = bufs + b * kBufBytes;
    for (int i = tid; i < kVBlock / 16; i += kThreads) {  // row s: column 0 (chunk 0) is one
      const int s = i / (kVRow / 16), c = i % (kVRow / 16);
      const uint32_t one = c == 0 ? pack2_f32<T>(1.f, 0.f) : 0u;
      *reinterpret_cast<uint4*>(buf + kVBlocks * kVBlock + swizzled_row_offset(s, c, kVRow)) = make_uint4(one, 0, 0, 0);
    }
    T* const kb = reinterpret_cast<T*>(buf + kKeyTile);
    for (int i = tid; i < kTokPad; i += kThreads) kb[d * kTokPad + i] = from_f32<T>(1.f);
  }
  if (tid == 0) {
    for (uint32_t b = 0; b < buffers; ++b) {
      mbarrier_init(&full[b], kProducerThreads);
      mbarrier_init(&empty[b], kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  fence_async_shared();  // the ones blocks, for the tensor cores
  __syncthreads();       // the roles meet only at the barriers from here on
  if (warp >= kConsumerWarps) {
    warpgroup_registers_lower<producer_registers<E, kSplit>()>();
    produce_update_steps<T, d, E, kSplit, kZWeight>(P, bufs, raws, full, empty, tid - kConsumerThreads);
    return;
  }
  warpgroup_registers_raise<consumer_registers<E, kSplit>()>();

  // Consumers: warpgroup wg holds m64 tiles (phi blocks) 2 wg and 2 wg + 1 of each tile. B of K
  // slice ks of buffer b: the descriptor of buffer 0 plus b kBufDesc plus ks kSliceDesc (kSplit: plus
  // kLoDesc for the values' lo part).
  const int wg = warp >> 2, wq = warp & 3;
  const uint64_t desc0 = nmajor_swizzled_desc(bufs, kVRow, kVBlock, 8 * kVRow);
  constexpr uint32_t kBufDesc = kBufBytes / 16, kSliceDesc = 16 * kVRow / 16, kLoDesc = value_part_bytes<T, E>() / 16;
  const int gate_off = (d + 1) * kTokPad + tq * 16;  // this lane's 16 tokens of the gate row
  // kSplit: two slots of A fragments, each with its lo part (the registers of four).
  constexpr int kSlots = kSplit ? 2 : kASlots;
  ring_position buffer;  // of this step's buffer, over the steps of all tiles so far
  uint32_t prev_buf = 0;
  // The phi blocks of a tile's m64 tiles (past the last block: any rows, never stored), read a tile
  // ahead so that a tile's first products do not wait for them.
  auto read_blocks = [&](int64_t tile, phi_block (&b)[2]) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int64_t block = tile % P.row_tiles * kBlocksPerCta + wg * 2 + mt;
      b[mt] = tile < P.tile_count && block < P.blocks.count ? P.blocks.block[block]
                                                            : phi_block{{uint16_t(d), uint16_t(d)}, 0, 0};
    }
  };
  phi_block next_blocks[2];
  read_blocks(blockIdx.x, next_blocks);
  for (int64_t tile = blockIdx.x; tile < P.tile_count; tile += gridDim.x) {
    const update_tile at = decode_update_tile(P, tile);
    // This lane's key rows per m64 tile (element offsets of its 16 tokens in a feature row).
    int last_off[2], mid_off[2][2], fixed_off[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const phi_block b = next_blocks[mt];
      last_off[mt] = (b.last + g) * kTokPad + tq * 16;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        mid_off[mt][hf] = (b.mid + 2 * wq + hf) * kTokPad + tq * 16;
        fixed_off[mt][hf] = b.fixed[hf] * kTokPad + tq * 16;
      }
    }
    read_blocks(tile + gridDim.x, next_blocks);
    // The layout rows of this lane's fragment rows, for the epilogue: read now, so that the loads
    // complete during the products (read at the end, their latency was a tenth of the epilogue's).
    phi_block_row out_row[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int64_t block = int64_t(at.row_tile) * kBlocksPerCta + wg * 2 + mt;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        out_row[mt][hf] = block < P.blocks.count ? P.blocks.row[block * 64 + (2 * wq + hf) * 8 + g] : phi_block_row{-1, 0.f};
    }
    float acc[2][N / 2];
    wgmma_zero(acc);
    // The A fragments of K slice ks (slot ks % kSlots) are read by that slice's products (one wgmma
    // group) until they complete; the slot is rewritten after waiting for that group only.
    uint32_t a[kSlots][2][4];
    [[maybe_unused]] uint32_t a_lo[kSplit ? kSlots : 1][2][4];
    for (int step = 0; step < at.steps; ++step) {
      const uint32_t buf = buffer.buf;
      mbarrier_wait(&full[buf], buffer.phase);
      const T* const kb = reinterpret_cast<const T*>(bufs + buf * kBufBytes + kKeyTile);
      const uint64_t step_desc = desc0 + buf * kBufDesc;
      // Half j of the step (slices 2j, 2j + 1): this lane's 16-byte slice of each factor row, the
      // last factor times the gates (but for kSplit); word 2 (ks % 2) + h of a slice is the token
      // pair of A register (ks, h) (wgmma.cuh: register 2h + hf).
      uint4 last[2][2], mid[2][2][2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint4 gates = make_uint4(0, 0, 0, 0);
        if constexpr (!kSplit) gates = *reinterpret_cast<const uint4*>(kb + gate_off + 8 * j);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          last[j][mt] = kSplit ? load_shared_16(kb + last_off[mt] + 8 * j) : mul2x4<T>(load_shared_16(kb + last_off[mt] + 8 * j), gates);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) mid[j][mt][hf] = *reinterpret_cast<const uint4*>(kb + mid_off[mt][hf] + 8 * j);
          if constexpr (PM == 4) {
            const uint4 f0 = *reinterpret_cast<const uint4*>(kb + fixed_off[mt][0] + 8 * j);
            const uint4 f1 = *reinterpret_cast<const uint4*>(kb + fixed_off[mt][1] + 8 * j);
            last[j][mt] = mul2x4<T>(last[j][mt], mul2x4<T>(f0, f1));
          }
        }
      }
#pragma unroll
      for (int ks = 0; ks < kTok / 16; ++ks) {
        wgmma_wait<kSlots - 1>();  // the group that last read this slot is complete
        const int j = ks / 2, kk = ks % 2, slot = ks % kSlots;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int hf = q & 1, w = 2 * kk + (q >> 1);
            // kSplit: the exact product as hi + lo (mul2_split).
            if constexpr (kSplit)
              mul2_split<T>(word_of(last[j][mt], w), word_of(mid[j][mt][hf], w), a[slot][mt][q], a_lo[slot][mt][q]);
            else
              a[slot][mt][q] = mul2<T>(word_of(last[j][mt], w), word_of(mid[j][mt][hf], w));
          }
        wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const uint64_t slice_desc = step_desc + ks * kSliceDesc;
          if constexpr (kSplit) wgmma_rs_split<T, N, true>(acc[mt], a[slot][mt], a_lo[slot][mt], slice_desc, slice_desc + kLoDesc);
          else wgmma_rs<T, N, true>(acc[mt], a[slot][mt], slice_desc);
        }
        wgmma_commit();
      }
      // The previous step's products are complete (the last wait above): its buffer is free.
      if (step >= 1 && lane == 0) mbarrier_arrive(&empty[prev_buf]);
      prev_buf = buf;
      buffer.advance(buffers);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) wgmma_pin(acc[mt]);
    if (lane == 0) mbarrier_arrive(&empty[prev_buf]);  // the tile's last step

    // Epilogue: each fragment row to its row of the layout (padding rows are dropped), times its
    // coefficient, f32 out.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const phi_block_row r = out_row[mt][hf];
        if (r.row < 0) continue;  // padding rows and blocks past the last
        store_state_row<kNT>(P, at.batch, at.chunk, at.head, r.row, r.coef, tq,
                             [&](int nt, int u) { return acc[mt][4 * nt + 2 * hf + u]; });
      }
    }
  }
}

}  // namespace expanse_cuda
