// The pieces of a GPU plugin's dispatch that do not depend on the vendor (oneDNN's implementation
// lists): for each operation an ordered list of implementations, fastest first, each with its name,
// the device features it needs, why it declines a problem, and how it runs one. dispatcher.hpp
// chooses from the lists; docs/backends.md tells how to add an implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "expanse/backend.h"

namespace expanse_sdk {

// What a device offers, found once by the backend's init() (device_info's numbers and the feature
// bits its implementations need).
struct device_props {
  int arch_major = 0, arch_minor = 0;  // compute capability (CUDA), gfx version (HIP)
  int multiprocessors = 0;             // SMs or compute units
  size_t smem_optin = 0;               // shared memory one block may use, with opt-in
  uint32_t features = 0;               // the backend's feature bits this device has (requirement)
};

// The architecture tag of an implementation: the feature bits a device must have, and the reason
// given on one that lacks them. A backend names its own bits (e.g. the CUDA backend's sm80, sm90a).
struct requirement {
  uint32_t features;
  const char* missing;
};
inline constexpr requirement any_device{0, ""};

// Scratch memory carved out of the caller's workspace. An operation runs twice: a sizing pass (only
// counts the bytes it takes, launches nothing) to answer workspace_size, then the real pass (whose
// workspace may be null when the operation needs none). Both take the same pieces in the same order,
// so both run the same code: the launch code of an implementation is its sizing code.
class workspace {
 public:
  static workspace for_sizing() { return workspace(nullptr, 0, true); }
  workspace(void* base, size_t bytes) : workspace(base, bytes, false) {}
  bool sizing() const { return sizing_; }
  // Pieces start at 256-byte aligned addresses (kernels load tables as 16-byte vectors), whatever
  // the alignment of the caller's workspace: the sizing pass counts 255 bytes of padding per piece.
  // In the sizing pass a piece is a stand-in address, aligned like the real one, so that a step's
  // alignment checks answer the same in both passes; it is never dereferenced (nothing launches).
  template <class T>
  T* take(size_t count) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(base_);
    const size_t at = sizing() ? used_ + 255 : (base + used_ + 255) / 256 * 256 - base;
    used_ = at + count * sizeof(T);
    if (!sizing() && used_ > bytes_) throw std::length_error("workspace too small");
    return reinterpret_cast<T*>(sizing() ? kStandIn + at / 256 * 256 : base + at);
  }
  size_t used() const { return used_; }

 private:
  static constexpr uintptr_t kStandIn = 256;
  workspace(void* base, size_t bytes, bool sizing)
      : base_(static_cast<char*>(base)), bytes_(bytes), sizing_(sizing) {}
  char* base_;
  size_t bytes_;
  bool sizing_;
  size_t used_ = 0;
};

// The caller's stream, which converts to the vendor's stream type (cudaStream_t, hipStream_t) where
// a launch takes one.
struct stream_handle {
  void* raw;
  template <class Stream, class = std::enable_if_t<std::is_pointer_v<Stream>>>
  operator Stream() const {
    return static_cast<Stream>(raw);
  }
};

class dispatcher;

// What an implementation's run() gets: the stream, the workspace of this pass, the device, and the
// backend's dispatcher with the call's op (composed operations run their steps through them).
struct launch_context {
  stream_handle stream;
  workspace& ws;
  const device_props& props;
  const dispatcher& dispatch;
  const expanse_op& call;  // the operation the core asked for (its memo keeps the steps' choices)
  // In a step of a composed operation: the inputs it made once for all its steps (a type of the
  // backend's, e.g. the gate sums and the phi table), which the step uses instead of making its own.
  const void* prepared = nullptr;
};

// The callback of expanse_power_attention_exchange and expanse_power_attention_backward_exchange
// (expanse.h): the initial state, or the final state's cotangent, arrives when it returns.
struct exchange_call {
  expanse_exchange_fn fn;
  void* user;
};

// One implementation of one operation.
struct implementation {
  const char* name;
  requirement needs;
  // Empty when this implementation takes the problem, else why not (shown to the user). Called
  // only on a device that has the features of `needs`.
  std::string (*declines)(const expanse_op& op, const device_props& props);
  // Takes its workspace pieces, then (unless sizing) enqueues its kernels on the stream.
  void (*run)(const expanse_op& op, launch_context& lc);
  // The one-pass form of power_attention's or power_attention_backward's exchanging call (backend.h's
  // EXPANSE_FORWARD_EXCHANGE_PROC, EXPANSE_BACKWARD_EXCHANGE_PROC): as run, reading what the exchange
  // writes (initial state, dfinal) only after calling it once (not in the sizing pass). Null where
  // the implementation has none.
  void (*run_exchanging)(const expanse_op& op, launch_context& lc, const exchange_call& exchange) = nullptr;
};

using implementation_list = std::vector<implementation>;

// A backend's lists, one per operation (a backward operation is an operation of its own), filled at
// load time by the operations' files (registered_list), read after.
class implementation_lists {
 public:
  void add(expanse_op_kind kind, implementation_list list) {
    if (kind < 0 || kind >= EXPANSE_OP_COUNT) throw std::logic_error("implementation list of an unknown operation");
    implementation_list& slot = lists_[kind];
    if (!slot.empty()) throw std::logic_error("an operation's implementation list is registered twice");
    slot = std::move(list);
  }
  // Empty for an operation the backend does not implement.
  const implementation_list& of(expanse_op_kind kind) const {
    static const implementation_list none;
    return kind >= 0 && kind < EXPANSE_OP_COUNT ? lists_[kind] : none;
  }

 private:
  implementation_list lists_[EXPANSE_OP_COUNT];
};

// Registers one operation's list, fastest first, from the file that defines it:
//   const expanse_sdk::registered_list kList(cuda_lists(), EXPANSE_OP_UPDATE_STATE, {...});
struct registered_list {
  registered_list(implementation_lists& lists, expanse_op_kind kind, std::initializer_list<implementation> list) {
    lists.add(kind, implementation_list(list));
  }
};

// Thrown when an operation (or a step of a composed one) has no implementation for the problem;
// the entry points report it as EXPANSE_ERROR_UNSUPPORTED with its text.
struct unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace expanse_sdk
