// The CUDA backend's dispatch: for each operation an ordered list of implementations, fastest first
// (oneDNN's implementation lists). The first whose `declines` returns no reason runs the problem;
// when every one declines, the reasons are joined into the "unsupported" message, so a user sees why
// no kernel took the problem. Set EXPANSE_CUDA_VERBOSE=1 to print which implementation runs, and
// EXPANSE_CUDA_SKIP=name,... to pass over implementations (tests and timings of the ones behind).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "expanse/backend.h"

namespace expanse_cuda {

// Properties of the device an operation runs on (queried once per device).
struct device_props {
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t smem_optin = 0;  // shared memory per block with opt-in
};

// Scratch memory carved out of the caller's workspace. An operation runs twice: a sizing pass
// (only counts the bytes it takes, launches nothing) to answer workspace_size, then the real pass
// (whose workspace may be null when the operation needs none). Both take the same pieces in the
// same order.
class workspace {
 public:
  static workspace for_sizing() { return workspace(nullptr, 0, true); }
  workspace(void* base, size_t bytes) : workspace(base, bytes, false) {}
  bool sizing() const { return sizing_; }
  // Pieces start at 256-byte aligned addresses (kernels load tables as 16-byte vectors), whatever
  // the alignment of the caller's workspace: the sizing pass counts 255 bytes of padding per piece.
  template <class T>
  T* take(size_t count) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(base_);
    const size_t at = sizing() ? used_ + 255 : (base + used_ + 255) / 256 * 256 - base;
    used_ = at + count * sizeof(T);
    if (!sizing() && used_ > bytes_) throw std::length_error("workspace too small");
    return sizing() ? nullptr : reinterpret_cast<T*>(base_ + at);
  }
  size_t used() const { return used_; }

 private:
  workspace(void* base, size_t bytes, bool sizing)
      : base_(static_cast<char*>(base)), bytes_(bytes), sizing_(sizing) {}
  char* base_;
  size_t bytes_;
  bool sizing_;
  size_t used_ = 0;
};

struct launch_context {
  cudaStream_t stream;
  workspace& ws;
  const device_props& props;
};

// One implementation of one operation.
struct implementation {
  const char* name;
  // Empty when this implementation takes the problem, else why not (shown to the user).
  std::string (*declines)(const expanse_op& op, const device_props& props);
  // Takes its workspace pieces, then (unless sizing) enqueues its kernels on the stream.
  void (*run)(const expanse_op& op, launch_context& lc);
};

// The lists, one per operation: <name>_impls(), defined beside each operation in ops/<name>.cu.
#define EXPANSE_CUDA_LIST_DECL(name, NAME) const std::vector<implementation>& name##_impls();
EXPANSE_OPERATIONS(EXPANSE_CUDA_LIST_DECL)
#undef EXPANSE_CUDA_LIST_DECL

// The implementation that takes `op` (nullptr and the joined reasons when none does).
const implementation* choose(const expanse_op& op, const device_props& props, std::string* reasons);

const char* op_name(expanse_op_kind kind);

// Throws std::runtime_error with the CUDA error text when the last launch failed.
void check_launch(const char* what);

// power_attention's chunk size for EXPANSE_CHUNK_AUTO (0: the quadratic form), chunk_choice.cpp.
int64_t choose_chunk_size(const expanse_problem* problem);

}  // namespace expanse_cuda
