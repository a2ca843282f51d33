// Context parallelism across GPUs through the C API and the CUDA plugin's NCCL all-gather: one thread
// per GPU of this machine (up to 8), a communicator each (ncclCommInitAll), the pieces' outputs and
// gradients against one call on GPU 0, within the docs/spec.md tolerance of the dtype. Exit code 77
// (a skip for ctest) where fewer than 2 CUDA devices are visible.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cases.hpp"
#include "context_parallel.hpp"
#include "test_seed.hpp"

namespace h = expanse::harness;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("skipped: context parallelism over NCCL needs 2 CUDA devices, %d visible\n", devices);
    return 77;
  }
  const int R = devices < 8 ? devices : 8;
  std::vector<ncclComm_t> comms(static_cast<size_t>(R));
  std::vector<int> ids;
  for (int r = 0; r < R; ++r) ids.push_back(r);
  if (ncclCommInitAll(comms.data(), R, ids.data()) != ncclSuccess) {
    std::printf("FAIL: ncclCommInitAll over %d GPUs\n", R);
    return 1;
  }
  expanse::context probe("cuda");
  void* gather = nullptr;
  if (expanse_backend_proc(probe.get(), "expanse_nccl_allgather", &gather) != EXPANSE_OK) {
    std::printf("FAIL: %s\n", expanse_last_error());
    return 1;
  }
  const auto collective = [&](int r) {
    return h::rank_collective{r, reinterpret_cast<expanse_allgather_fn>(gather), comms[size_t(r)]};
  };

  // Uneven pieces over R ranks, GQA, gates with resets, initial and final states, b = 2: f32 (the
  // SIMT kernels) and bf16 at d = e = 64 (the tensor-core ones).
  std::vector<h::op_config> cases;
  h::op_config c;
  c.op = expanse::ops::power_attention_backward;
  c.b = 2, c.t = 300, c.hq = 4, c.h = 2, c.d = 8, c.e = 6, c.p = 2, c.c = 32, c.dtype = EXPANSE_F32;
  c.gated = c.resets = c.normalize = c.initial_state = c.final_state = true;
  cases.push_back(c);
  c.b = 1, c.t = 4000, c.d = c.e = 64, c.c = 1024, c.dtype = EXPANSE_BF16, c.resets = false;
  cases.push_back(c);

  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const h::op_config& cfg = cases[i];
    std::vector<int64_t> bounds{0};
    for (int r = 1; r < R; ++r) bounds.push_back(cfg.t * r / R + (r % 2 ? 7 : -5));  // uneven
    bounds.push_back(cfg.t);
    const uint64_t seed = test_seed() + i;
    const h::tensor_map in = h::make_inputs(cfg, seed);
    h::op_config forward = cfg;
    forward.op = expanse::ops::power_attention;
    h::tensor_map fin;
    for (const char* name : {"q", "k", "v", "log_g", "initial_S", "initial_z"})
      if (in.count(name)) fin[name] = in.at(name);
    const double tol = h::tolerance_for(cfg.dtype);
    for (bool backward : {false, true}) {
      const h::op_config& run_cfg = backward ? cfg : forward;
      const h::tensor_map& run_in = backward ? in : fin;
      const h::tensor_map one = h::run_on(probe, run_cfg, run_in, false);
      const h::tensor_map pieces = h::context_parallel_threads("cuda", run_cfg, run_in, bounds, collective);
      for (const h::comparison& cmp : h::compare(pieces, one, tol)) {
        std::printf("%s  %s %s over %d GPUs: %-10s rel. error %.3e (tolerance %.0e)  seed %llu\n",
                    cmp.pass ? "PASS" : "FAIL", backward ? "backward" : "forward ", cfg.label().c_str(), R,
                    cmp.output.c_str(), cmp.rel_error, cmp.tolerance, static_cast<unsigned long long>(seed));
        failures += !cmp.pass;
      }
    }
  }
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
  return failures == 0 ? 0 : 1;
}
