// Context parallelism across GPUs through the C API and the CUDA plugin's NCCL all-gather, as a
// framework runs it: one process per GPU of this machine (up to 8), each with its NCCL communicator
// (ncclCommInitRank). This program starts them (itself with --rank) and waits for them, within a
// deadline; a failing line prints the seed of its inputs ($EXPANSE_TEST_SEED reruns it). Each rank compares its piece's outputs and gradients with one call over the whole
// sequence on its own GPU, within the docs/spec.md tolerance of the dtype. Exit code 77 (a skip for
// ctest) where fewer than 2 CUDA devices are visible.
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cases.hpp"
#include "context_parallel.hpp"
#include "test_seed.hpp"

extern char** environ;

namespace h = expanse::harness;

namespace {

// Long enough for the cases below with a cold start on every GPU; short enough that a hang fails.
constexpr auto kDeadline = std::chrono::seconds(240);

std::string to_hex(const ncclUniqueId& id) {
  std::string s;
  char byte[3];
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(id.internal[i]));
    s += byte;
  }
  return s;
}

bool from_hex(const std::string& s, ncclUniqueId& id) {
  if (s.size() != 2 * sizeof(id.internal)) return false;
  for (size_t i = 0; i < sizeof(id.internal); ++i) id.internal[i] = char(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return true;
}

// Uneven pieces over R ranks, GQA, gates with resets, initial and final states, b = 2: f32 (the
// SIMT kernels) and bf16 at d = e = 64 (the tensor-core ones).
std::vector<h::op_config> cases() {
  std::vector<h::op_config> list;
  h::op_config c;
  c.op = expanse::ops::power_attention_backward;
  c.b = 2, c.t = 300, c.hq = 4, c.h = 2, c.d = 8, c.e = 6, c.p = 2, c.c = 32, c.dtype = EXPANSE_F32;
  c.gated = c.resets = c.normalize = c.initial_state = c.final_state = true;
  list.push_back(c);
  c.b = 1, c.t = 4000, c.d = c.e = 64, c.c = 1024, c.dtype = EXPANSE_BF16, c.resets = false;
  list.push_back(c);
  return list;
}

int run_rank(int rank, int ranks, const ncclUniqueId& id, uint64_t first_seed) {
  if (cudaSetDevice(rank) != cudaSuccess) {
    std::printf("FAIL: rank %d: cudaSetDevice\n", rank);
    return 1;
  }
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, ranks, id, rank) != ncclSuccess) {
    std::printf("FAIL: rank %d: ncclCommInitRank over %d GPUs\n", rank, ranks);
    return 1;
  }
  expanse::context ctx("cuda", rank);
  void* gather = nullptr;
  if (expanse_backend_proc(ctx.get(), "expanse_nccl_allgather", &gather) != EXPANSE_OK) {
    std::printf("FAIL: rank %d: %s\n", rank, expanse_last_error());
    return 1;
  }
  const h::rank_collective mine{rank, reinterpret_cast<expanse_allgather_fn>(gather), comm};

  int failures = 0;
  const std::vector<h::op_config> list = cases();
  for (size_t i = 0; i < list.size(); ++i) {
    const h::op_config& cfg = list[i];
    std::vector<int64_t> bounds{0};
    for (int r = 1; r < ranks; ++r) bounds.push_back(cfg.t * r / ranks + (r % 2 ? 7 : -5));  // uneven
    bounds.push_back(cfg.t);
    const uint64_t seed = first_seed + i;  // the same inputs on every rank
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
      const h::tensor_map piece = h::context_parallel_rank("cuda", run_cfg, run_in, bounds, rank, mine);
      const h::tensor_map one = h::rank_share(h::run_on(ctx, run_cfg, run_in, false), bounds, rank);
      for (const h::comparison& cmp : h::compare(piece, one, tol)) {
        std::printf("%s  rank %d of %d: %s %s: %-10s rel. error %.3e (tolerance %.0e)  seed %llu\n",
                    cmp.pass ? "PASS" : "FAIL", rank, ranks, backward ? "backward" : "forward ", cfg.label().c_str(),
                    cmp.output.c_str(), cmp.rel_error, cmp.tolerance, static_cast<unsigned long long>(seed));
        failures += !cmp.pass;
      }
    }
  }
  ncclCommDestroy(comm);
  return failures == 0 ? 0 : 1;
}

// Starts `ranks` copies of this program, one per GPU, with this process's seed (every rank draws
// the same inputs), and waits for them until the deadline.
int run_ranks(const char* self, int ranks) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {  // this process serves the ranks' rendezvous
    std::printf("FAIL: ncclGetUniqueId\n");
    return 1;
  }
  const std::string hex = to_hex(id), count = std::to_string(ranks), seed = std::to_string(test_seed());
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const std::string rank = std::to_string(r);
    std::vector<char*> args{const_cast<char*>(self), const_cast<char*>("--rank"), const_cast<char*>(rank.c_str()),
                            const_cast<char*>(count.c_str()), const_cast<char*>(hex.c_str()),
                            const_cast<char*>(seed.c_str()), nullptr};
    pid_t pid;
    if (posix_spawn(&pid, self, nullptr, nullptr, args.data(), environ) != 0) {
      std::printf("FAIL: could not start rank %d\n", r);
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  int failures = 0;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  for (size_t left = pids.size(); left > 0;) {
    for (pid_t& pid : pids) {
      int status = 0;
      if (pid <= 0 || waitpid(pid, &status, WNOHANG) != pid) continue;
      failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      pid = 0, --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      std::printf("FAIL: %zu of %d ranks still running after %lld s (a hang in the exchange?)\n", left, ranks,
                  static_cast<long long>(kDeadline.count()));
      for (pid_t pid : pids)
        if (pid > 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes, also into a file
  if (argc == 6 && std::strcmp(argv[1], "--rank") == 0) {  // --rank RANK RANKS NCCL_ID SEED
    ncclUniqueId id;
    if (!from_hex(argv[4], id)) return 2;
    return run_rank(std::atoi(argv[2]), std::atoi(argv[3]), id, std::strtoull(argv[5], nullptr, 10));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("skipped: context parallelism over NCCL needs 2 CUDA devices, %d visible\n", devices);
    return 77;
  }
  return run_ranks("/proc/self/exe", devices < 8 ? devices : 8);
}
