// power_attention_step: decoding tokens. S <- g S + phi(k) v^T and z <- g z + phi(k) in place,
// then o = phi(scale q)^T S [/ phi(scale q)^T z] for every query head of the group. For one token two
// forms, for several a third (step_tokens_kernel, below):
// - streamed (step_stream_kernel): a block per kStreamRows (or fewer) rows of one head's state; phi(k) and
//   phi(q) of those rows are formed once into shared memory, then every thread streams 4 columns of
//   its rows (16-byte loads and stores where the layout allows), so that each state entry is read
//   and written once at memory speed; each block writes its sums as one row block's partials, which
//   step_output_kernel adds in order (deterministic). Up to kStreamMaxGroup query heads per kv head
//   and e <= 1024.
// - the first form (step_update_kernel), for the rest: each thread updates 32 rows of one column,
//   forming phi of every row itself; a second kernel sums the partials.
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

constexpr int kStepRowsPerThread = 32, kStepThreads = 128;

// The sums of phi(q) . S, phi and the updated entries they take, in cancelling_sum_t (f64 for f32
// inputs: an f32 step at p = 4 came out 5e-5 off).
template <class T>
using step_sum_t = cancelling_sum_t<T>;

template <class T>
__global__ void step_update_kernel(expanse_tensor q, expanse_tensor k, expanse_tensor v, expanse_tensor log_g,
                                   expanse_tensor S, expanse_tensor z, const phi_entry* table, expanse_problem pb,
                                   float scale, step_sum_t<T>* partial, int64_t row_blocks, int64_t col_groups) {
  using sum_t = step_sum_t<T>;
  const int64_t cols = pb.e + 1;  // column e is z
  int64_t blk = blockIdx.x;
  const int64_t cg = blk % col_groups;
  blk /= col_groups;
  const int64_t rb = blk % row_blocks;
  blk /= row_blocks;
  const int64_t head = blk % pb.h, batch = blk / pb.h;
  const int64_t col = cg * kStepThreads + threadIdx.x;
  if (col >= cols || (col == pb.e && z.data == nullptr)) return;
  const sum_t gate = log_g.data ? exp(sum_t(loadf(log_g, off3(log_g, batch, 0, head)))) : sum_t(1);
  const sum_t val = col < pb.e ? load<T>(v, off4(v, batch, 0, head, col)) : 1.f;
  const int64_t r0 = rb * kStepRowsPerThread;
  const int rows = static_cast<int>(min(int64_t(kStepRowsPerThread), pb.D - r0));
  const int64_t koff = off4(k, batch, 0, head, 0);
  sum_t s[kStepRowsPerThread];
#pragma unroll
  for (int j = 0; j < kStepRowsPerThread; ++j) {
    if (j >= rows) break;
    const int64_t r = r0 + j;
    const sum_t ph = phi_value_as<sum_t>(table[r], pb.p, [&](int i) { return sum_t(load<T>(k, koff + i * k.strides[3])); });
    float* p = col < pb.e ? ptrf(S, off4(S, batch, head, r, col)) : ptrf(z, off3(z, batch, head, r));
    s[j] = gate * *p + ph * val;
    *p = float(s[j]);
  }
  const int64_t group = pb.hq / pb.h;
  for (int64_t gi = 0; gi < group; ++gi) {
    const int64_t qh = head * group + gi;
    const int64_t qoff = off4(q, batch, 0, qh, 0);
    sum_t acc = 0;
#pragma unroll
    for (int j = 0; j < kStepRowsPerThread; ++j) {
      if (j >= rows) break;
      acc += phi_value_as<sum_t>(table[r0 + j], pb.p, [&](int i) { return sum_t(scale) * sum_t(load<T>(q, qoff + i * q.strides[3])); }) * s[j];
    }
    partial[((batch * pb.hq + qh) * row_blocks + rb) * cols + col] = acc;
  }
}

constexpr int kStepOutputThreads = 256, kStepOutputColumns = kStepOutputThreads / kLaneGroup;

// step_output_kernel's blocks per query row: kStepOutputColumns columns each.
__host__ __device__ inline int64_t step_output_column_blocks(const expanse_problem& pb) {
  return (pb.e + kStepOutputColumns - 1) / kStepOutputColumns;
}

// o from the row blocks' partials [b,hq,t][row_blocks][e + 1] (column e: the denominator, written only
// where normalized): a lane group per output column adds the row blocks of its column and of the
// denominator (lanes over the blocks, then a shuffle tree: a fixed order, so deterministic); blocks of
// kStepOutputColumns columns of one (batch, query head, token), blockIdx.x = that row * column_blocks
// + column block. (A thread per output adding the blocks in turn took 20 us at b = 1, twice the state's
// pass; a block per (batch, query head), 15 us.)
template <class T>
__global__ void __launch_bounds__(kStepOutputThreads)
    step_output_kernel(const step_sum_t<T>* partial, expanse_tensor o, expanse_problem pb, int64_t row_blocks,
                       int normalize) {
  using sum_t = step_sum_t<T>;
  const int64_t column_blocks = step_output_column_blocks(pb);
  const int64_t cols = pb.e + 1, row = blockIdx.x / column_blocks, i = row % pb.t, qh = row / pb.t % pb.hq,
                batch = row / pb.t / pb.hq;
  const int64_t col = (blockIdx.x % column_blocks) * kStepOutputColumns + threadIdx.x / kLaneGroup;
  const int lane = threadIdx.x % kLaneGroup;
  if (col >= pb.e) return;  // whole lane groups leave together
  const sum_t* part = partial + row * row_blocks * cols;
  auto column_sum = [&](int64_t c) {
    sum_t t = 0;
    for (int64_t rb = lane; rb < row_blocks; rb += kLaneGroup) t += part[rb * cols + c];
    for (int off = kLaneGroup / 2; off > 0; off >>= 1) t += shfl_xor_group(t, off);
    return t;
  };
  const sum_t num = column_sum(col), den = normalize ? column_sum(pb.e) : sum_t(1);
  const sum_t out = normalize ? (den != 0 ? num / den : sum_t(0)) : num;
  if (lane == 0) static_cast<T*>(o.data)[off4(o, batch, i, qh, col)] = from_f32<T>(float(out));
}

// The grid of step_output_kernel.
inline unsigned step_output_blocks(const expanse_problem& pb) {
  const int64_t blocks = pb.b * pb.hq * pb.t * step_output_column_blocks(pb);
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);  // (an empty block returns at once)
}

constexpr int kStreamThreads = 256, kStreamRows = 128, kStreamBatch = 4, kStreamMaxGroup = 8;

// G: the query heads per kv head, rounded up to a power of two (each costs 5 registers, and the
// registers bound the blocks per SM: at 120 registers, 2 blocks per SM moved 1.6 TB/s at P1, b = 64;
// hence the register bounds: 64 for 4 blocks with one query head, fewer blocks with more). quads: a power of two >= ceil(e / 4), at most kStreamThreads (the lanes
// of a row); vec: S rows are 16-byte aligned runs of e % 4 == 0 floats.
template <class T, int G>
__global__ void __launch_bounds__(kStreamThreads, G == 1 ? 4 : G == 2 ? 3 : 2)
    step_stream_kernel(expanse_tensor q, expanse_tensor k, expanse_tensor v, expanse_tensor log_g, expanse_tensor S,
                       expanse_tensor z, const phi_entry* table, expanse_problem pb, float scale,
                       step_sum_t<T>* partial, int64_t row_blocks, int block_rows, int quads, int vec) {
  using sum_t = step_sum_t<T>;
  __shared__ sum_t phik[kStreamRows], phiq[G][kStreamRows];
  __shared__ sum_t red[kStreamThreads * 4];
  const int tid = threadIdx.x;
  const int64_t rb = blockIdx.x % row_blocks, bh = blockIdx.x / row_blocks, head = bh % pb.h, batch = bh / pb.h;
  const int64_t r0 = rb * block_rows, group = pb.hq / pb.h;
  const int rows = static_cast<int>(min(int64_t(block_rows), pb.D - r0));
  const sum_t gate = log_g.data ? exp(sum_t(loadf(log_g, off3(log_g, batch, 0, head)))) : sum_t(1);
  for (int item = tid; item < rows * (1 + group); item += kStreamThreads) {
    const int j = item % rows, which = item / rows;  // 0: the key, 1 + g: query head g of the group
    const phi_entry& row = table[r0 + j];
    if (which == 0) {
      phik[j] = phi_value_as<sum_t>(row, pb.p, [&](int i) { return sum_t(load<T>(k, off4(k, batch, 0, head, i))); });
    } else {
      const int64_t qh = head * group + which - 1;
      phiq[which - 1][j] =
          phi_value_as<sum_t>(row, pb.p, [&](int i) { return sum_t(scale) * sum_t(load<T>(q, off4(q, batch, 0, qh, i))); });
    }
  }
  __syncthreads();
  const int c4 = tid % quads, lane_rows = kStreamThreads / quads, rsub = tid / quads;
  const int64_t col = 4 * int64_t(c4);
  sum_t vv[4];
  for (int x = 0; x < 4; ++x) vv[x] = col + x < pb.e ? load<T>(v, off4(v, batch, 0, head, col + x)) : 0.f;
  sum_t acc[G][4], den[G];
  for (int g = 0; g < G; ++g) {
    den[g] = 0;
    for (int x = 0; x < 4; ++x) acc[g][x] = 0;
  }
  // kStreamBatch rows per thread at a time: their loads all in flight before the first store (the
  // compiler keeps a load after a store it cannot prove apart).
  for (int j0 = rsub; j0 < rows; j0 += kStreamBatch * lane_rows) {
    float old[kStreamBatch][4], zold[kStreamBatch];
#pragma unroll
    for (int u = 0; u < kStreamBatch; ++u) {
      const int j = j0 + u * lane_rows;
      const int64_t r = r0 + j;
      for (int x = 0; x < 4; ++x) old[u][x] = 0.f;
      zold[u] = 0.f;
      if (j >= rows) continue;
      if (col < pb.e) {
        if (vec) {
          const float4 w = *reinterpret_cast<const float4*>(ptrf(S, off4(S, batch, head, r, col)));
          old[u][0] = w.x, old[u][1] = w.y, old[u][2] = w.z, old[u][3] = w.w;
        } else {
          for (int x = 0; x < 4; ++x)
            if (col + x < pb.e) old[u][x] = *ptrf(S, off4(S, batch, head, r, col + x));
        }
      }
      if (c4 == 0 && z.data) zold[u] = *ptrf(z, off3(z, batch, head, r));
    }
#pragma unroll
    for (int u = 0; u < kStreamBatch; ++u) {
      const int j = j0 + u * lane_rows;
      const int64_t r = r0 + j;
      if (j >= rows) continue;
      const sum_t pk = phik[j];
      if (col < pb.e) {
        sum_t s[4];
        for (int x = 0; x < 4; ++x) s[x] = gate * old[u][x] + pk * vv[x];
        if (vec) {
          *reinterpret_cast<float4*>(ptrf(S, off4(S, batch, head, r, col))) =
              make_float4(float(s[0]), float(s[1]), float(s[2]), float(s[3]));
        } else {
          for (int x = 0; x < 4; ++x)
            if (col + x < pb.e) *ptrf(S, off4(S, batch, head, r, col + x)) = float(s[x]);
        }
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (g < group)
            for (int x = 0; x < 4; ++x) acc[g][x] += phiq[g][j] * s[x];
      }
      if (c4 == 0 && z.data) {
        const sum_t zn = gate * zold[u] + pk;
        *ptrf(z, off3(z, batch, head, r)) = float(zn);
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (g < group) den[g] += phiq[g][j] * zn;
      }
    }
  }
  // The block's sums for each query head (over the row lanes of each column quad), as this row
  // block's partials (step_output_kernel's layout: column e is the denominator).
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g >= group) break;
    __syncthreads();  // red is free
    for (int x = 0; x < 4; ++x) red[(rsub * quads + c4) * 4 + x] = acc[g][x];
    __syncthreads();
    sum_t* out = partial + ((batch * pb.hq + head * group + g) * row_blocks + rb) * (pb.e + 1);
    for (int item = tid; item < quads * 4; item += kStreamThreads) {
      const int64_t c = item;  // = 4 c4 + x
      if (c >= pb.e) continue;
      sum_t t = 0;
      for (int l = 0; l < lane_rows; ++l) t += red[l * quads * 4 + item];
      out[c] = t;
    }
    __syncthreads();
    if (c4 == 0) red[rsub] = den[g];
    __syncthreads();
    if (tid == 0 && z.data) {
      sum_t t = 0;
      for (int l = 0; l < lane_rows; ++l) t += red[l];
      out[pb.e] = t;
    }
  }
}

// A step of several tokens (t >= 2: speculative decoding's drafts) in one pass over the state, by the
// chunked form of one chunk from the state S_0 (docs/spec.md): with g_l the gates, P_i = prod_{l <= i}
// g_l and W_ij = prod_{j < l <= i} g_l (products, so that a reset g = 0 zeroes what is behind it),
//   S_new = P_{t-1} S_0 + sum_j W_{t-1,j} phi(k_j) v_j^T        (z likewise, with 1 for v_j)
//   o_i   = P_i phi(q_i)^T S_0 + sum_{j <= i} W_ij (scale q_i . k_j)^p v_j  [/ the same with z and 1]
// A block takes block_rows rows of one head's state in tiles of kTokensTileRows: per tile it forms
// phi(k_j) and phi(q_i) of the tile's rows in shared memory, reads each state entry once (kept in
// shared memory) and writes its new value, then adds the tile's share of phi(q_i)^T S_0 to the
// outputs (i g, columns) each thread owns, held in registers across the tiles (up to kTokensSlots
// queries per thread: i g < kTokensSlots x 256 / quads). quads and vec as the streamed kernel's. The
// next tile's entries are loaded while the outputs and phi are formed. The block's sums are one row
// block's partials for step_output_kernel; row block 0 adds the pairs' terms. The state is read
// and written once, as by the one-token kernels, whatever t.
constexpr int kTokensThreads = 256, kTokensTileRows = 32, kTokensSlots = 4, kTokensBatch = 4;

// Four consecutive sums from shared memory, 16-byte aligned: one vector load (two for f64).
__device__ __forceinline__ void load4(const float* p, float (&w)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
__device__ __forceinline__ void load4(const double* p, double (&w)[4]) {
  const double2 a = reinterpret_cast<const double2*>(p)[0], b = reinterpret_cast<const double2*>(p)[1];
  w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
}

// Lanes per state row of 4 columns each (the streamed and tokens kernels): a power of two >= ceil(e / 4),
// at most 256.
__host__ __device__ inline int step_column_quads(int64_t e) {
  int quads = 1;
  while (4 * quads < e && quads < 256) quads *= 2;
  return quads;
}

// Shared memory of step_tokens_kernel, carved in this order: old first and the rows of old, vals and
// wv `stride` long (a multiple of 4: 16-byte accesses of a column quad; z's column at stride - 4),
// then the other sum_t arrays and the floats.
template <class T>
struct step_tokens_smem {
  int64_t t, tg, d, stride;  // tokens, tokens x query heads of the group, key dim, row stride
  __host__ __device__ step_tokens_smem(const expanse_problem& pb)
      : t(pb.t), tg(pb.t * (pb.hq / pb.h)), d(pb.d), stride(4 * step_column_quads(pb.e) + 4) {}
  // old [rows][stride] (f32); vals [t][stride], W_last vals [t][stride], gates [t], P [t], W_last [t],
  // pairs [tg][t], phik [t][rows], phiq [tg][rows], red [threads][5]; floats: q [tg][d], k [t][d].
  __host__ __device__ int64_t sums() const {
    return 2 * t * stride + 3 * t + tg * t + (t + tg) * kTokensTileRows + 5 * kTokensThreads;
  }
  __host__ __device__ int64_t floats() const { return kTokensTileRows * stride + (tg + t) * d; }
  __host__ __device__ size_t bytes() const {
    return size_t(sums()) * sizeof(step_sum_t<T>) + size_t(floats()) * sizeof(float);
  }
};

// Three blocks per SM where the sums are f32; f64 sums, for f32 inputs, need the registers of two.
// (A name of its own: a comma would split HIP's __launch_bounds__ macro.)
template <class T>
constexpr int kTokensBlocksPerSM = std::is_same_v<step_sum_t<T>, float> ? 3 : 2;

// Slots: the queries a thread takes in the outputs, 1 where t g <= 256 / quads, else kTokensSlots
// (the registers of one leave three blocks per SM unspilled).
template <class T, int Slots>
__global__ void __launch_bounds__(kTokensThreads, kTokensBlocksPerSM<T>)
    step_tokens_kernel(expanse_tensor q, expanse_tensor k, expanse_tensor v, expanse_tensor log_g, expanse_tensor S,
                       expanse_tensor z, const phi_entry* table, expanse_problem pb, float scale,
                       step_sum_t<T>* partial, int64_t row_blocks, int block_rows, int quads, int vec) {
  using sum_t = step_sum_t<T>;
  extern __shared__ __align__(16) unsigned char step_tokens_shared[];
  const step_tokens_smem<T> L(pb);
  // (int: the sizes are bounded by the launcher's shared memory; 64-bit divisions cost ~100 instructions)
  const int t = int(L.t), tg = int(L.tg), d = int(L.d), stride = int(L.stride), e = int(pb.e),
            group = int(pb.hq / pb.h), cols = e + 1, zc = stride - 4;  // cols: the partials' row
  float* const old = reinterpret_cast<float*>(step_tokens_shared);
  sum_t* const vals = reinterpret_cast<sum_t*>(old + kTokensTileRows * stride);
  sum_t* const wv = vals + t * stride;  // W_last[j] vals[j][c]: the update's weights
  sum_t* const gates = wv + t * stride;
  sum_t* const P = gates + t;
  sum_t* const W_last = P + t;
  sum_t* const pairs = W_last + t;
  sum_t* const phik = pairs + tg * t;
  sum_t* const phiq = phik + t * kTokensTileRows;
  sum_t* const red = phiq + tg * kTokensTileRows;
  float* const qs = reinterpret_cast<float*>(red + 5 * kTokensThreads);
  float* const ks = qs + tg * d;

  const int tid = threadIdx.x;
  const int64_t rb = blockIdx.x % row_blocks, bh = blockIdx.x / row_blocks, head = bh % pb.h, batch = bh / pb.h;
  const int64_t r0 = rb * block_rows, rows = min(int64_t(block_rows), pb.D - r0);
  // The tokens: queries of the group (row i g), keys, values with a column of ones, gates.
  for (int x = tid; x < tg * d; x += kTokensThreads) {
    const int ig = x / d, i = ig / group, g = ig % group;
    qs[x] = load<T>(q, off4(q, batch, i, head * group + g, x % d));
  }
  for (int x = tid; x < t * d; x += kTokensThreads) ks[x] = load<T>(k, off4(k, batch, x / d, head, x % d));
  for (int x = tid; x < t * stride; x += kTokensThreads) {
    const int j = x / stride, c = x % stride;
    vals[x] = c < e ? sum_t(load<T>(v, off4(v, batch, j, head, c))) : sum_t(c == zc ? 1 : 0);
  }
  if (tid == 0) {
    for (int j = 0; j < t; ++j) gates[j] = log_g.data ? exp(sum_t(loadf(log_g, off3(log_g, batch, j, head)))) : sum_t(1);
    sum_t prod = 1;
    for (int i = 0; i < t; ++i) P[i] = prod *= gates[i];
    prod = 1;
    for (int j = t - 1; j >= 0; --j) {
      W_last[j] = prod;
      prod *= gates[j];
    }
  }
  __syncthreads();
  for (int x = tid; x < t * stride; x += kTokensThreads) wv[x] = W_last[x / stride] * vals[x];
  if (rb == 0)  // the pairs' (scale q_i . k_j)^p, j <= i
    for (int x = tid; x < tg * t; x += kTokensThreads) {
      const int ig = x / t, j = x % t;
      sum_t dot = 0;
      if (j <= ig / group)
        for (int a = 0; a < d; ++a) dot += sum_t(qs[ig * d + a]) * sum_t(ks[j * d + a]);
      sum_t power = 1;
      for (int a = 0; a < pb.p; ++a) power *= sum_t(scale) * dot;
      pairs[x] = j <= ig / group ? power : sum_t(0);
    }

  // Each thread owns the columns 4 c4 .. 4 c4 + 3 (c4 = 0 also z's; as the streamed kernel's lanes:
  // no division per entry), in the update of the tile's rows rsub + u lane_rows. In the outputs its row
  // lane rsub = split il + oig takes the queries ig = oig + m il (il: a power of two >= t g, at most
  // lane_rows) over the tile's rows split + s splits, so that every thread works whatever t g; the
  // splits are summed at the end.
  const int c4 = tid % quads, lane_rows = kTokensThreads / quads, rsub = tid / quads, col = 4 * c4;
  const bool zlane = c4 == 0 && z.data != nullptr;
  int il = lane_rows;  // (more slots than one: t g > lane_rows, so il = lane_rows and one split)
  if (Slots == 1)
    for (il = 1; il < tg && il < lane_rows;) il *= 2;
  const int splits = Slots == 1 ? lane_rows / il : 1, oig = Slots == 1 ? rsub % il : rsub,
            split = Slots == 1 ? rsub / il : 0;
  sum_t acc[Slots][4], den[Slots];
#pragma unroll
  for (int m = 0; m < Slots; ++m) {
    den[m] = 0;
    for (int x = 0; x < 4; ++x) acc[m][x] = 0;
  }
  // This thread's entries of a tile (rows rsub + u lane_rows: at most kTokensBatch, by the launcher's
  // e <= 128), loaded a tile ahead.
  float was[kTokensBatch][4], zwas[kTokensBatch];
  auto load_tile = [&](int64_t tile) {
#pragma unroll
    for (int u = 0; u < kTokensBatch; ++u) {
      const int j = rsub + u * lane_rows;
      const int64_t r = r0 + tile + j;
      zwas[u] = 0.f;
      for (int x = 0; x < 4; ++x) was[u][x] = 0.f;
      if (tile + j >= rows || j >= kTokensTileRows) continue;
      if (vec && col < e) {
        const float4 w = *reinterpret_cast<const float4*>(ptrf(S, off4(S, batch, head, r, col)));
        was[u][0] = w.x, was[u][1] = w.y, was[u][2] = w.z, was[u][3] = w.w;
      } else {
        for (int x = 0; x < 4; ++x)
          if (col + x < e) was[u][x] = *ptrf(S, off4(S, batch, head, r, col + x));
      }
      if (zlane) zwas[u] = *ptrf(z, off3(z, batch, head, r));
    }
  };
  load_tile(0);
  for (int64_t tile = 0; tile < rows; tile += kTokensTileRows) {
    const int tile_rows = static_cast<int>(min(int64_t(kTokensTileRows), rows - tile));
    __syncthreads();  // the previous tile's phi and old values are read; P, wv, pairs are set
    for (int x = tid; x < (t + tg) * kTokensTileRows; x += kTokensThreads) {
      const int which = x / kTokensTileRows, j = x % kTokensTileRows;
      if (j >= tile_rows) continue;
      const phi_entry& row = table[r0 + tile + j];
      if (which < t)
        phik[x] = phi_value_as<sum_t>(row, pb.p, [&](int a) { return sum_t(ks[which * d + a]); });
      else
        phiq[x - t * kTokensTileRows] =
            phi_value_as<sum_t>(row, pb.p, [&](int a) { return sum_t(scale) * sum_t(qs[(which - t) * d + a]); });
    }
    __syncthreads();
    // Each entry of the tile once: kept as it was, written as it becomes.
#pragma unroll
    for (int u = 0; u < kTokensBatch; ++u) {
      const int j = rsub + u * lane_rows;
      const int64_t r = r0 + tile + j;
      if (j >= tile_rows) break;
      sum_t now[4], znow = P[t - 1] * sum_t(zwas[u]);
      for (int x = 0; x < 4; ++x) now[x] = P[t - 1] * sum_t(was[u][x]);
      for (int i = 0; i < t; ++i) {
        const sum_t f = phik[i * kTokensTileRows + j];
        sum_t w[4];
        load4(wv + i * stride + col, w);
        for (int x = 0; x < 4; ++x) now[x] += f * w[x];
        znow += f * wv[i * stride + zc];
      }
      if (col < e) {
        *reinterpret_cast<float4*>(old + j * stride + col) = make_float4(was[u][0], was[u][1], was[u][2], was[u][3]);
        if (vec) {
          *reinterpret_cast<float4*>(ptrf(S, off4(S, batch, head, r, col))) =
              make_float4(float(now[0]), float(now[1]), float(now[2]), float(now[3]));
        } else {
          for (int x = 0; x < 4; ++x)
            if (col + x < e) *ptrf(S, off4(S, batch, head, r, col + x)) = float(now[x]);
        }
      }
      if (zlane) {
        old[j * stride + zc] = zwas[u];
        *ptrf(z, off3(z, batch, head, r)) = float(znow);
      }
    }
    load_tile(tile + kTokensTileRows);  // in flight through the outputs and the next tile's phi
    __syncthreads();
    // This tile's share of phi(q_i)^T S_0 for the thread's queries and columns.
#pragma unroll
    for (int m = 0; m < Slots; ++m) {
      const int ig = oig + m * il;
      if (m * il >= tg) break;
      if (ig >= tg) continue;
      for (int j = split; j < tile_rows; j += splits) {
        const sum_t f = phiq[ig * kTokensTileRows + j];
        const float4 o4 = *reinterpret_cast<const float4*>(old + j * stride + col);  // 0 past e
        acc[m][0] += f * sum_t(o4.x), acc[m][1] += f * sum_t(o4.y), acc[m][2] += f * sum_t(o4.z),
            acc[m][3] += f * sum_t(o4.w);
        if (zlane) den[m] += f * sum_t(old[j * stride + zc]);
      }
    }
  }
  // The partials: P_i phi(q_i)^T S_0 (the splits' sums added through shared memory), plus in row
  // block 0 the pairs' terms, W_ij from j = i down.
#pragma unroll
  for (int m = 0; m < Slots; ++m) {
    const int ig = oig + m * il;
    if (m * il >= tg) break;
    if (splits > 1) {
      __syncthreads();  // red is free
      for (int x = 0; x < 4; ++x) red[5 * tid + x] = acc[m][x];
      red[5 * tid + 4] = den[m];
      __syncthreads();
      if (split == 0)
        for (int sp = 1; sp < splits; ++sp) {
          const sum_t* other = red + 5 * ((sp * il + oig) * quads + c4);
          for (int x = 0; x < 4; ++x) acc[m][x] += other[x];
          den[m] += other[4];
        }
    }
    if (ig >= tg || split != 0) continue;
    const int i = ig / group, g = ig % group;
    sum_t* const out = partial + (((batch * pb.hq + head * group + g) * t + i) * row_blocks + rb) * cols;
    for (int x = 0; x <= 4; ++x) {  // x = 4: z's column, in lane c4 = 0
      const int c = x < 4 ? col + x : e;
      if (x < 4 ? c >= e : !zlane) continue;
      sum_t value = P[i] * (x < 4 ? acc[m][x] : den[m]);
      if (rb == 0) {
        sum_t w = 1;
        for (int jj = i; jj >= 0; --jj) {
          value += w * pairs[ig * t + jj] * vals[jj * stride + (x < 4 ? c : zc)];
          w *= gates[jj];
        }
      }
      out[c] = value;
    }
  }
}

// The multi-token step's copy of the state `from` ([b,h,D,e] or [b,h,D], f32, any strides) into
// the dense `to` (sdk/step_through_attention.hpp): a block per head, its entries in order.
constexpr int kCopyStateThreads = 256;
__global__ void __launch_bounds__(kCopyStateThreads) copy_state_kernel(expanse_tensor from, float* to, bool dense) {
  const int64_t h = from.shape[1], heads = from.shape[0] * h;
  const int64_t cols = from.ndim == 4 ? from.shape[3] : 1, col_stride = from.ndim == 4 ? from.strides[3] : 0;
  const int64_t per_head = from.shape[2] * cols;
  for (int64_t head = blockIdx.x; head < heads; head += gridDim.x) {
    const float* src = ptrf(from, (head / h) * from.strides[0] + (head % h) * from.strides[1]);
    float* dst = to + head * per_head;
    for (int64_t i = threadIdx.x; i < per_head; i += blockDim.x) {
      const int64_t row = i / cols;
      dst[i] = dense ? src[i] : src[row * from.strides[2] + (i - row * cols) * col_stride];
    }
  }
}

}  // namespace expanse_gpu
