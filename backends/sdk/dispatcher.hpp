// Choosing from a backend's implementation lists, and the entry points of backend.h built on it.
//
// The first implementation whose device has the features it needs and whose `declines` returns no
// reason runs the problem; when every one declines, their reasons are joined into the
// "unsupported" message, so a user sees why no kernel took it. The choice is made once per call:
// the core hands supports, workspace_size and run one memo (expanse_op::memo), where the index of
// the chosen implementation is kept (memo[0] = index + 1), and the steps of a composed operation
// keep theirs in the words after it (run_step).
//
// Environment, read once (NAME is the backend's, upper case: CUDA, HIP):
//   EXPANSE_<NAME>_VERBOSE=1         prints to stderr which implementation runs, and why the ones
//                                    before it declined
//   EXPANSE_<NAME>_SKIP=name,name    passes over those implementations, of every operation (tests
//                                    and timings of the ones behind them)
#pragma once

#include <string>

#include "sdk/implementation.hpp"

namespace expanse_sdk {

// Steps of one composed operation whose choices the memo keeps (16-bit slots after memo[0]).
constexpr int kStepSlots = (EXPANSE_OP_MEMO_WORDS - 1) * 4;

class dispatcher {
 public:
  // name: "cuda", "hip" (messages start with it; the environment variables are named for it).
  dispatcher(const char* name, const implementation_lists& lists);
  const char* name() const { return name_.c_str(); }

  // The implementation that takes `op` on a device with `props` (nullptr and the joined reasons
  // when none does), recalled from op.memo when this call chose before.
  const implementation* choose(const expanse_op& op, const device_props& props, std::string* reasons) const;

  // backend.h's entry points, once the backend has found the device's properties (and, for run,
  // made the device current). Errors are written to the buffers, prefixed with the backend's name.
  expanse_status supports(const expanse_op& op, const device_props& props, char* reason, size_t reason_len) const;
  expanse_status workspace_size(const expanse_op& op, const device_props& props, size_t* bytes) const;
  // With `exchange`: the chosen implementation's run_exchanging, or EXPANSE_ERROR_UNSUPPORTED before
  // any work where it has none.
  expanse_status run(const expanse_op& op, const device_props& props, const expanse_exec& exec, char* err,
                     size_t err_len, const exchange_call* exchange = nullptr) const;

  // Runs `step`, one operation of the composed operation lc.call, through its own list on lc's
  // stream and workspace (in lc's pass: sizing or real). Its choice is kept in the call's memo under
  // `slot` (1..kStepSlots, one per step of the composed operation). Throws `unsupported` when no
  // implementation takes the step.
  void run_step(const expanse_op& step, int slot, launch_context& lc) const;

 private:
  const implementation* choose_into(const expanse_op& op, const device_props& props, int64_t* memo, int slot,
                                    const char* context, std::string* reasons) const;
  // The bytes `impl` takes for `op` (a sizing pass).
  size_t size(const implementation& impl, const expanse_op& op, const device_props& props) const;

  std::string name_;
  const implementation_lists& lists_;
  bool verbose_;
  std::string skip_;  // ",name,name," (empty: none)
};

// Writes `text` into a caller's buffer of `len` bytes (truncated, always terminated).
void write_text(char* buf, size_t len, const std::string& text);

}  // namespace expanse_sdk
