#include "dispatch.hpp"

#include <cstdio>
#include <cstdlib>

namespace expanse_cuda {

// Each operation's list, by kind (EXPANSE_OPERATIONS: <name>_impls() of ops/<name>.cu).
static const std::vector<implementation>& list_of(expanse_op_kind kind) {
  using list_fn = const std::vector<implementation>& (*)();
#define EXPANSE_CUDA_LIST(name, NAME) &name##_impls,
  static const list_fn lists[EXPANSE_OP_COUNT] = {EXPANSE_OPERATIONS(EXPANSE_CUDA_LIST)};
#undef EXPANSE_CUDA_LIST
  static const std::vector<implementation> none;
  return kind >= 0 && kind < EXPANSE_OP_COUNT ? lists[kind]() : none;
}

// The plugin must not call into libexpanse (the core loads it RTLD_LOCAL, and Python loads the core
// RTLD_LOCAL too), so it keeps its own names.
const char* op_name(expanse_op_kind kind) {
#define EXPANSE_CUDA_NAME(name, NAME) #name,
  static const char* const names[] = {EXPANSE_OPERATIONS(EXPANSE_CUDA_NAME)};
#undef EXPANSE_CUDA_NAME
  return kind >= 0 && kind < EXPANSE_OP_COUNT ? names[kind] : "unknown op";
}

const implementation* choose(const expanse_op& op, const device_props& props, std::string* reasons) {
  static const bool verbose = [] {
    const char* v = std::getenv("EXPANSE_CUDA_VERBOSE");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  // EXPANSE_CUDA_SKIP: comma-separated implementation names to pass over (to test or time the
  // ones behind them); a skipped implementation declines with that reason.
  static const std::string skip = [] {
    const char* v = std::getenv("EXPANSE_CUDA_SKIP");
    return v ? "," + std::string(v) + "," : std::string();
  }();
  // The choice of this call, when supports or workspace_size made it already (expanse_op::memo).
  const std::vector<implementation>& list = list_of(op.kind);
  if (op.memo != nullptr && op.memo[0] > 0 && size_t(op.memo[0]) <= list.size()) return &list[size_t(op.memo[0] - 1)];
  std::string why;
  for (const implementation& impl : list) {
    const bool skipped = skip.find("," + std::string(impl.name) + ",") != std::string::npos;
    const std::string reason = skipped ? "skipped (EXPANSE_CUDA_SKIP)" : impl.declines(op, props);
    if (reason.empty()) {
      if (verbose) std::fprintf(stderr, "expanse cuda: %s -> %s\n", op_name(op.kind), impl.name);
      if (op.memo != nullptr) op.memo[0] = int64_t(&impl - list.data()) + 1;
      return &impl;
    }
    if (verbose) std::fprintf(stderr, "expanse cuda: %s: %s declines: %s\n", op_name(op.kind), impl.name, reason.c_str());
    why += (why.empty() ? "" : "; ") + std::string(impl.name) + ": " + reason;
  }
  if (reasons) *reasons = why.empty() ? "no implementation of this operation" : why;
  return nullptr;
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace expanse_cuda
