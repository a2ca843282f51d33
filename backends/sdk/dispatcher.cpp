#include "sdk/dispatcher.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "sdk/op_args.hpp"

namespace expanse_sdk {
namespace {

std::string env_name(const std::string& backend, const char* what) {
  std::string name = "EXPANSE_";
  for (char c : backend) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name + "_" + what;
}

// memo[0] holds the call's own choice; slot s >= 1 (a step) is the 16-bit field (s - 1) % 4 of
// word 1 + (s - 1) / 4. A stored value is the implementation's index + 1 (0: not chosen yet).
int64_t recalled(const int64_t* memo, int slot) {
  if (memo == nullptr) return 0;
  if (slot == 0) return memo[0];
  return (memo[1 + (slot - 1) / 4] >> (16 * ((slot - 1) % 4))) & 0xffff;
}

void remember(int64_t* memo, int slot, size_t index) {
  if (memo == nullptr) return;
  if (slot == 0) {
    memo[0] = static_cast<int64_t>(index) + 1;
    return;
  }
  int64_t& word = memo[1 + (slot - 1) / 4];
  const int shift = 16 * ((slot - 1) % 4);
  word = (word & ~(int64_t(0xffff) << shift)) | (int64_t(index + 1) << shift);
}

}  // namespace

void write_text(char* buf, size_t len, const std::string& text) {
  if (buf != nullptr && len > 0) std::snprintf(buf, len, "%s", text.c_str());
}

dispatcher::dispatcher(const char* name, const implementation_lists& lists) : name_(name), lists_(lists) {
  const char* verbose = std::getenv(env_name(name_, "VERBOSE").c_str());
  verbose_ = verbose != nullptr && verbose[0] != '\0' && verbose[0] != '0';
  const char* skip = std::getenv(env_name(name_, "SKIP").c_str());
  if (skip != nullptr && skip[0] != '\0') skip_ = "," + std::string(skip) + ",";
}

const implementation* dispatcher::choose(const expanse_op& op, const device_props& props, std::string* reasons) const {
  return choose_into(op, props, op.memo, 0, op_name(op.kind), reasons);
}

const implementation* dispatcher::choose_into(const expanse_op& op, const device_props& props, int64_t* memo, int slot,
                                              const char* context, std::string* reasons) const {
  const implementation_list& list = lists_.of(op.kind);
  const int64_t before = recalled(memo, slot);
  if (before > 0 && static_cast<size_t>(before) <= list.size()) return &list[static_cast<size_t>(before - 1)];
  std::string why;
  for (size_t i = 0; i < list.size(); ++i) {
    const implementation& impl = list[i];
    std::string reason;
    if (!skip_.empty() && skip_.find("," + std::string(impl.name) + ",") != std::string::npos)
      reason = "skipped (" + env_name(name_, "SKIP") + ")";
    else if ((props.features & impl.needs.features) != impl.needs.features)
      reason = impl.needs.missing;
    else
      reason = impl.declines(op, props);
    if (reason.empty()) {
      if (verbose_) std::fprintf(stderr, "expanse %s: %s -> %s\n", name(), context, impl.name);
      remember(memo, slot, i);
      return &impl;
    }
    if (verbose_) std::fprintf(stderr, "expanse %s: %s: %s declines: %s\n", name(), context, impl.name, reason.c_str());
    why += (why.empty() ? "" : "; ") + std::string(impl.name) + ": " + reason;
  }
  if (reasons) *reasons = why.empty() ? "no implementation of this operation" : why;
  return nullptr;
}

void dispatcher::run_step(const expanse_op& step, int slot, launch_context& lc) const {
  if (slot < 1 || slot > kStepSlots) throw std::logic_error("step slot out of range");
  const std::string context = std::string(op_name(lc.call.kind)) + " step " + op_name(step.kind);
  std::string why;
  const implementation* impl = choose_into(step, lc.props, lc.call.memo, slot, context.c_str(), &why);
  if (impl == nullptr) throw unsupported(context + ": " + why);
  impl->run(step, lc);
}

size_t dispatcher::size(const implementation& impl, const expanse_op& op, const device_props& props) const {
  workspace ws = workspace::for_sizing();
  launch_context lc{{nullptr}, ws, props, *this, op};
  impl.run(op, lc);
  return ws.used();
}

expanse_status dispatcher::supports(const expanse_op& op, const device_props& props, char* reason,
                                    size_t reason_len) const {
  try {
    std::string why;
    const implementation* impl = choose(op, props, &why);
    if (impl == nullptr) {
      write_text(reason, reason_len, why);
      return EXPANSE_ERROR_UNSUPPORTED;
    }
    size(*impl, op, props);  // a composed operation's steps choose theirs here
    return EXPANSE_OK;
  } catch (const std::exception& e) {
    write_text(reason, reason_len, e.what());
    return EXPANSE_ERROR_UNSUPPORTED;
  }
}

expanse_status dispatcher::workspace_size(const expanse_op& op, const device_props& props, size_t* bytes) const {
  *bytes = 0;
  try {
    const implementation* impl = choose(op, props, nullptr);
    if (impl == nullptr) return EXPANSE_ERROR_UNSUPPORTED;
    *bytes = size(*impl, op, props);
    return EXPANSE_OK;
  } catch (const unsupported&) {
    return EXPANSE_ERROR_UNSUPPORTED;
  } catch (const std::exception&) {
    return EXPANSE_ERROR_INTERNAL;
  }
}

expanse_status dispatcher::run(const expanse_op& op, const device_props& props, const expanse_exec& exec, char* err,
                               size_t err_len, const exchange_call* exchange) const {
  try {
    std::string why;
    const implementation* impl = choose(op, props, &why);
    if (impl == nullptr) {
      write_text(err, err_len, name_ + ": " + why);
      return EXPANSE_ERROR_UNSUPPORTED;
    }
    if (exchange && !impl->run_exchanging) {
      write_text(err, err_len, name_ + ": " + impl->name + " has no one-pass exchanging form");
      return EXPANSE_ERROR_UNSUPPORTED;
    }
    // Size first, so a too-small workspace is reported before anything is enqueued.
    const size_t needed = size(*impl, op, props);
    if (needed > exec.workspace_bytes) {
      write_text(err, err_len, name_ + ": " + op_name(op.kind) + " needs a workspace of " + std::to_string(needed) +
                                   " bytes, got " + std::to_string(exec.workspace_bytes));
      return EXPANSE_ERROR_WORKSPACE;
    }
    workspace ws(exec.workspace, exec.workspace_bytes);
    launch_context lc{{exec.stream}, ws, props, *this, op};
    if (exchange) impl->run_exchanging(op, lc, *exchange);
    else impl->run(op, lc);
    return EXPANSE_OK;
  } catch (const unsupported& e) {
    write_text(err, err_len, name_ + ": " + e.what());
    return EXPANSE_ERROR_UNSUPPORTED;
  } catch (const std::exception& e) {
    write_text(err, err_len, name_ + ": " + e.what());
    return EXPANSE_ERROR_INTERNAL;
  }
}

}  // namespace expanse_sdk
