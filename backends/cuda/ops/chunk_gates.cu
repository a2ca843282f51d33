// Gate prefix sums inside chunks: Gc [b,h,t] (inclusive cumulative sum of log_g within each chunk)
// and the chunk totals [b,h,n]. Summed in f64 so that Gc_i - Gc_j keeps f32 accuracy even deep
// into long chunks, where both terms are large.
#include "ops/op_common.hpp"

namespace expanse_cuda {
namespace {

constexpr int kThreads = 256;

// One block per (chunk, head, batch): each thread sums a run of consecutive tokens, a block scan
// of the run totals gives each run its offset, then each thread writes its run.
__global__ void chunk_gates_kernel(expanse_tensor log_g, int64_t t, int64_t h, int64_t c, int64_t n, float* Gc,
                                   float* total) {
  __shared__ double run_sums[kThreads];
  const int64_t m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int64_t first = m * c, len = min(c, t - first);
  const int64_t per = (len + kThreads - 1) / kThreads;
  const int64_t begin = min(len, threadIdx.x * per), end = min(len, begin + per);
  const float* g = static_cast<const float*>(log_g.data);
  double sum = 0;
  for (int64_t i = begin; i < end; ++i) sum += g[off3(log_g, batch, first + i, head)];
  run_sums[threadIdx.x] = sum;
  __syncthreads();
  for (int step = 1; step < kThreads; step *= 2) {  // inclusive Hillis-Steele scan
    const double add = threadIdx.x >= step ? run_sums[threadIdx.x - step] : 0.0;
    __syncthreads();
    run_sums[threadIdx.x] += add;
    __syncthreads();
  }
  double acc = threadIdx.x > 0 ? run_sums[threadIdx.x - 1] : 0.0;
  float* out = Gc + (batch * h + head) * t + first;
  for (int64_t i = begin; i < end; ++i) {
    acc += g[off3(log_g, batch, first + i, head)];
    out[i] = static_cast<float>(acc);
  }
  if (threadIdx.x == kThreads - 1) total[(batch * h + head) * n + m] = static_cast<float>(run_sums[kThreads - 1]);
}

}  // namespace

gates make_gates(const expanse_tensor* log_g, int64_t b, int64_t t, int64_t h, int64_t c, launch_context& lc) {
  gates g;
  if (log_g == nullptr) return g;
  const int64_t n = chunk_count(t, c);
  float* Gc = lc.ws.take<float>(static_cast<size_t>(b * h * t));
  float* total = lc.ws.take<float>(static_cast<size_t>(b * h * n));
  g.Gc = Gc;
  g.total = total;
  if (lc.ws.sizing() || t == 0) return g;
  if (n > 2147483647 || h > 65535 || b > 65535) throw std::runtime_error("chunk_gates: grid too large");
  chunk_gates_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(h), static_cast<unsigned>(b)), kThreads, 0,
                       lc.stream>>>(*log_g, t, h, c, n, Gc, total);
  check_launch("chunk_gates");
  return g;
}

}  // namespace expanse_cuda
