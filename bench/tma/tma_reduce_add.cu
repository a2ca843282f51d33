// How fast CTAs can sum partial outputs into global memory on sm_90a, the rate r of the fused
// forward's cost model (docs/fused.md, "What to measure first"): R CTAs add their f32 tiles into
// each tile of a buffer, by
//   store   plain 16-byte stores (no sum: the write rate the others are measured against)
//   red     a scalar atomic add per element (red.global.add.f32)
//   red_v4  sm_90's 16-byte vector atomic add (four f32 per instruction)
//   bulk    TMA reduce-add: cp.reduce.async.bulk .add.f32 of a whole tile from shared memory,
//           issued by one thread, completion by bulk group
// into a buffer that fits in L2 and into one that does not. Every method's result is checked (each
// entry must hold R times the added value; the stores, the value). One JSON line per measurement:
//   expanse_tma_reduce_add [--parts R] [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 256;
constexpr int kTileFloats = 4096;  // 16 KB per tile: a TMA transfer, or 16 float4 per thread
constexpr float kValue = 0.5f;     // exact in f32, as are its small multiples

enum class method { store, red, red_v4, bulk };
const char* name_of(method m) {
  switch (m) {
    case method::store: return "store";
    case method::red: return "red";
    case method::red_v4: return "red_v4";
    default: return "bulk";
  }
}

// Work item w adds one tile into tile w % tiles: consecutive items go to different tiles, and each
// tile receives `parts` items, from different CTAs of the persistent grid.
__global__ void __launch_bounds__(kThreads) add_tiles(float* out, long long tiles, int parts, method how) {
  __shared__ __align__(128) float tile[kTileFloats];
  for (int i = threadIdx.x; i < kTileFloats; i += kThreads) tile[i] = kValue;
  __syncthreads();
  const long long items = tiles * parts;
  if (how == method::bulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The tile was written by the threads (the generic proxy); the bulk copy reads it through the
    // async proxy, which must see those writes first.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned src = static_cast<unsigned>(__cvta_generic_to_shared(tile));
      for (long long w = blockIdx.x; w < items; w += gridDim.x) {
        float* dst = out + (w % tiles) * kTileFloats;
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                     "r"(kTileFloats * 4)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the sums are done before the CTA exits
    }
#endif
    return;
  }
  for (long long w = blockIdx.x; w < items; w += gridDim.x) {
    float* dst = out + (w % tiles) * kTileFloats;
    for (int i = threadIdx.x * 4; i < kTileFloats; i += kThreads * 4) {
      const float4 v = *reinterpret_cast<const float4*>(tile + i);
      if (how == method::store) {
        *reinterpret_cast<float4*>(dst + i) = v;
      } else if (how == method::red) {
        atomicAdd(dst + i, v.x), atomicAdd(dst + i + 1, v.y), atomicAdd(dst + i + 2, v.z), atomicAdd(dst + i + 3, v.w);
      } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float4*>(dst + i), v);
#endif
      }
    }
  }
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "expanse_tma_reduce_add: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int parts = 4, reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--parts")) parts = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: expanse_tma_reduce_add [--parts R] [--reps N]\n");
      return 2;
    }
  }
  cudaDeviceProp props{};
  if (!ok(cudaGetDeviceProperties(&props, 0), "no CUDA device")) return 1;
  if (props.major < 9) {
    std::fprintf(stderr, "expanse_tma_reduce_add: needs sm_90 (TMA, vector atomics); device 0 is sm_%d%d\n", props.major,
                 props.minor);
    return 1;
  }
  const int grid = props.multiProcessorCount * 4;
  const size_t buffers[] = {size_t(16) << 20, size_t(1) << 30};  // inside the 50 MB L2, and far beyond it
  int failures = 0;
  for (size_t bytes : buffers) {
    const long long tiles = static_cast<long long>(bytes / (kTileFloats * sizeof(float)));
    float* out = nullptr;
    if (!ok(cudaMalloc(&out, bytes), "cudaMalloc")) return 1;
    cudaEvent_t start, stop;
    cudaEventCreate(&start), cudaEventCreate(&stop);
    std::vector<float> host(bytes / sizeof(float));
    for (method how : {method::store, method::red, method::red_v4, method::bulk}) {
      // Correctness first: one launch from zero.
      cudaMemset(out, 0, bytes);
      add_tiles<<<grid, kThreads>>>(out, tiles, parts, how);
      if (!ok(cudaDeviceSynchronize(), name_of(how))) return 1;
      cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost);
      const float want = how == method::store ? kValue : kValue * float(parts);
      const long long wrong = std::count_if(host.begin(), host.end(), [&](float x) { return x != want; });
      failures += wrong != 0;
      // Then the rate over `reps` launches (sums keep growing; the rate does not depend on the values).
      cudaEventRecord(start);
      for (int r = 0; r < reps; ++r) add_tiles<<<grid, kThreads>>>(out, tiles, parts, how);
      cudaEventRecord(stop);
      if (!ok(cudaEventSynchronize(stop), name_of(how))) return 1;
      float ms = 0.f;
      cudaEventElapsedTime(&ms, start, stop);
      const double added = double(bytes) * parts * reps;  // bytes sent into the buffer
      std::printf(
          "{\"op\": \"tma_reduce_add\", \"device\": \"%s\", \"method\": \"%s\", \"buffer_bytes\": %zu, \"parts\": %d, "
          "\"grid\": %d, \"tile_bytes\": %d, \"ms_per_launch\": %.4f, \"added_gb_per_s\": %.1f, \"wrong_entries\": %lld}\n",
          props.name, name_of(how), bytes, parts, grid, int(kTileFloats * sizeof(float)), ms / reps, added / (ms * 1e-3) / 1e9,
          wrong);
    }
    cudaEventDestroy(start), cudaEventDestroy(stop);
    cudaFree(out);
  }
  return failures ? 1 : 0;
}
