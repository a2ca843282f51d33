// power_attention_step: one decoding token. S <- g S + phi(k) v^T and z <- g z + phi(k) in place,
// then o = phi(scale q)^T S [/ phi(scale q)^T z] for every query head of the group. Two forms:
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

// o from the row blocks' partials [b,hq][row_blocks][e + 1] (column e: the denominator, written only
// where normalized): a lane group per output column adds the row blocks of its column and of the
// denominator (lanes over the blocks, then a shuffle tree: a fixed order, so deterministic); blocks of
// kStepOutputColumns columns of one (batch, query head), blockIdx.x = bq * column_blocks + column block. (A thread per output adding the blocks in turn took 20 us at b = 1, twice the state's
// pass; a block per (batch, query head), 15 us.)
template <class T>
__global__ void __launch_bounds__(kStepOutputThreads)
    step_output_kernel(const step_sum_t<T>* partial, expanse_tensor o, expanse_problem pb, int64_t row_blocks,
                       int normalize) {
  using sum_t = step_sum_t<T>;
  const int64_t column_blocks = step_output_column_blocks(pb);
  const int64_t cols = pb.e + 1, bq = blockIdx.x / column_blocks, qh = bq % pb.hq, batch = bq / pb.hq;
  const int64_t col = (blockIdx.x % column_blocks) * kStepOutputColumns + threadIdx.x / kLaneGroup;
  const int lane = threadIdx.x % kLaneGroup;
  if (col >= pb.e) return;  // whole lane groups leave together
  const sum_t* part = partial + bq * row_blocks * cols;
  auto column_sum = [&](int64_t c) {
    sum_t t = 0;
    for (int64_t rb = lane; rb < row_blocks; rb += kLaneGroup) t += part[rb * cols + c];
    for (int off = kLaneGroup / 2; off > 0; off >>= 1) t += shfl_xor_group(t, off);
    return t;
  };
  const sum_t num = column_sum(col), den = normalize ? column_sum(pb.e) : sum_t(1);
  const sum_t out = normalize ? (den != 0 ? num / den : sum_t(0)) : num;
  if (lane == 0) static_cast<T*>(o.data)[off4(o, batch, 0, qh, col)] = from_f32<T>(float(out));
}

// The grid of step_output_kernel.
inline unsigned step_output_blocks(const expanse_problem& pb) {
  const int64_t blocks = pb.b * pb.hq * step_output_column_blocks(pb);
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

}  // namespace expanse_gpu
