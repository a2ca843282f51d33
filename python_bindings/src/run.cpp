// run(): one operation of the C ABI on framework arrays. The Python layer (expanse/_ops.py) decides
// defaults; this file fills the op's args struct by name through the library's tables, asks the
// library for the shapes of the outputs to allocate, has the caller's framework allocate them (and the
// workspace, from inside the call), and runs the op with one expanse_run on the caller's stream.
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "contexts.hpp"
#include "errors.hpp"
#include "tensors.hpp"

namespace expanse_py {
namespace {

// The kind of the operation named `name` (ValueError listing the names for another).
expanse_op_kind kind_of(const std::string& name) {
  expanse_op_kind kind;
  check(expanse_op_from_name(name.c_str(), &kind));
  return kind;
}

// An operation's *_args struct, filled by name through the library's tables: no operation is spelled
// out here.
class op_args {
 public:
  explicit op_args(expanse_op_kind kind) : kind_(kind) {
    const size_t size = expanse_op_args_size(kind);
    if (size > sizeof(bytes_)) raise_status(EXPANSE_ERROR_INTERNAL, "args struct larger than expected");
    check(expanse_op_args_init(kind, bytes_));
    tensors_count_ = expanse_op_tensor_args(kind, &tensors_);
    params_count_ = expanse_op_params(kind, &params_);
  }
  const void* get() const { return bytes_; }
  const expanse_tensor_arg_info* tensor_arg(const std::string& name) const {
    for (int32_t i = 0; i < tensors_count_; ++i)
      if (name == tensors_[i].name) return &tensors_[i];
    return nullptr;
  }
  int32_t index_of(const expanse_tensor_arg_info* info) const { return int32_t(info - tensors_); }
  void set_tensor(const expanse_tensor_arg_info& info, const expanse_tensor* t) {
    std::memcpy(bytes_ + info.offset, &t, sizeof(t));
  }
  // Sets the parameter `name` from a Python value; false when the op has no such parameter.
  bool set_param(const std::string& name, nb::handle value) {
    for (int32_t i = 0; i < params_count_; ++i) {
      const expanse_param_info& p = params_[i];
      if (name != p.name) continue;
      char* at = bytes_ + p.offset;
      if (p.type == EXPANSE_PARAM_INT32) store(at, nb::cast<int32_t>(value));
      else if (p.type == EXPANSE_PARAM_INT64) store(at, nb::cast<int64_t>(value));
      else if (p.type == EXPANSE_PARAM_DOUBLE) store(at, nb::cast<double>(value));
      else store(at, expanse_layout{nb::cast<int32_t>(value[0]), nb::cast<int32_t>(value[1])});
      return true;
    }
    return false;
  }
  // The parameters as Python values (for last_call()).
  void describe_params(nb::dict& d) const {
    for (int32_t i = 0; i < params_count_; ++i) {
      const expanse_param_info& p = params_[i];
      const char* at = bytes_ + p.offset;
      if (p.type == EXPANSE_PARAM_INT32) d[p.name] = load<int32_t>(at);
      else if (p.type == EXPANSE_PARAM_INT64) d[p.name] = load<int64_t>(at);
      else if (p.type == EXPANSE_PARAM_DOUBLE) d[p.name] = load<double>(at);
      else d[p.name] = nb::make_tuple(load<expanse_layout>(at).kind, load<expanse_layout>(at).d_tile);
    }
  }

 private:
  template <class T> static void store(char* at, const T& v) { std::memcpy(at, &v, sizeof(v)); }
  template <class T> static T load(const char* at) {
    T v;
    std::memcpy(&v, at, sizeof(v));
    return v;
  }
  expanse_op_kind kind_;
  alignas(16) char bytes_[512]{};
  const expanse_tensor_arg_info* tensors_ = nullptr;
  const expanse_param_info* params_ = nullptr;
  int32_t tensors_count_ = 0, params_count_ = 0;
};

// What the last run() of this thread handed to the library: lets tests check that no array was
// copied (data pointers), which stream was used and which scalars the Python defaults became. Plain
// C++ data, no Python objects, so that it can outlive the interpreter in a thread_local.
struct call_record {
  std::string op, backend;
  int32_t device = 0;
  uintptr_t stream = 0;
  size_t workspace_bytes = 0;
  std::vector<unsigned char> args;  // a copy of the args struct (its parameters)
  bool check_finite = false;
  std::map<std::string, expanse_tensor> tensors;
};
thread_local call_record last;

// The workspace of one call from the caller's framework (expanse_context_set_allocator), called by
// the library from inside expanse_run, where the GIL is released.
struct framework_workspace {
  nb::callable allocate;
  array_keeper& keep;
  int32_t device_type;
  size_t bytes = 0;
  std::string error;
  static void* grow(void* self, size_t bytes) noexcept {
    auto& w = *static_cast<framework_workspace*>(self);
    nb::gil_scoped_acquire gil;
    try {
      nb::object array = w.allocate(nb::make_tuple(static_cast<int64_t>(bytes)), "u8");
      const array_keeper::raw raw = w.keep.bytes_of("workspace", array, /*writable=*/true);
      if (raw.bytes < bytes || raw.device_type != w.device_type) return nullptr;
      w.bytes = bytes;
      return raw.data;
    } catch (const std::exception& e) {
      w.error = e.what();
      return nullptr;
    }
  }
};

// expanse_power_attention_backward_exchange's callback: a Python callable taking the stream, called
// by the library from inside the call, where the GIL is released.
struct python_exchange {
  nb::object fn;
  std::string error;
  static int32_t call(void* stream, void* self) noexcept {
    auto& x = *static_cast<python_exchange*>(self);
    nb::gil_scoped_acquire gil;
    try {
      x.fn(reinterpret_cast<uintptr_t>(stream));
      return 0;
    } catch (const std::exception& e) {
      x.error = e.what();
      return 1;
    }
  }
};

nb::dict run(const std::string& op, const std::string& backend, int32_t device, int32_t device_type,
             uintptr_t stream, nb::dict inputs, nb::dict outputs, nb::callable allocate, nb::dict params,
             bool check_finite, nb::object exchange) {
  const expanse_op_kind kind = kind_of(op);
  if (!exchange.is_none() && kind != EXPANSE_OP_POWER_ATTENTION && kind != EXPANSE_OP_POWER_ATTENTION_BACKWARD)
    throw nb::value_error((op + ": only power_attention and its backward take an exchange").c_str());
  op_args args(kind);
  expanse_context* ctx = context_for(backend, device);
  // The contexts are cached and shared by every call of this thread: set the check on each call.
  check(expanse_context_set_check_finite(ctx, check_finite ? 1 : 0));
  for (auto [key, value] : params) {
    const std::string name = nb::cast<std::string>(key);
    if (!args.set_param(name, value)) throw nb::value_error((op + ": unknown parameter '" + name + "'").c_str());
  }

  // std::map keeps its values' addresses while it grows: the args struct points at them.
  array_keeper keep;
  std::map<std::string, expanse_tensor> views;
  auto bind = [&](const expanse_tensor_arg_info& info, const expanse_tensor& t) {
    views[info.name] = t;
    args.set_tensor(info, &views[info.name]);
  };
  for (auto [key, value] : inputs) {
    const std::string name = nb::cast<std::string>(key);
    const expanse_tensor_arg_info* info = args.tensor_arg(name);
    if (!info || info->role != EXPANSE_ARG_INPUT) throw nb::value_error((op + ": unknown input '" + name + "'").c_str());
    if (!value.is_none()) bind(*info, keep.view(name, value, /*writable=*/false));
  }
  nb::dict result;
  std::vector<std::pair<const expanse_tensor_arg_info*, std::string>> to_allocate;  // (output, dtype or "")
  for (auto [key, value] : outputs) {
    const std::string name = nb::cast<std::string>(key);
    const expanse_tensor_arg_info* info = args.tensor_arg(name);
    if (!info || info->role == EXPANSE_ARG_INPUT) throw nb::value_error((op + ": unknown output '" + name + "'").c_str());
    if (value.is_none()) continue;
    if (nb::isinstance<nb::str>(value)) {  // a dtype ("" for the library's): allocated below
      to_allocate.emplace_back(info, nb::cast<std::string>(value));
    } else {
      bind(*info, keep.view(name, value, /*writable=*/true));
      result[name.c_str()] = value;
    }
  }
  // Output shapes are the library's (expanse_output_shape validates the inputs first, so bad input
  // costs no allocation); then the outputs come from the caller's framework.
  for (auto& [info, dtype] : to_allocate) {
    int32_t ndim = 0, code = 0;
    int64_t shape[EXPANSE_MAX_DIMS] = {};
    check(expanse_output_shape(kind, args.get(), args.index_of(info), &ndim, shape, &code));
    nb::object array = allocate(std::vector<int64_t>(shape, shape + ndim),
                                dtype.empty() ? std::string(expanse_dtype_name(expanse_dtype(code))) : dtype);
    bind(*info, keep.view(info->name, array, /*writable=*/true));
    result[info->name] = array;
  }

  check(expanse_context_set_stream(ctx, reinterpret_cast<void*>(stream)));
  framework_workspace workspace{allocate, keep, device_type};
  check(expanse_context_set_allocator(ctx, &framework_workspace::grow, &workspace));
  python_exchange exchanging{exchange, {}};
  expanse_status st;
  {
    // One call: validation, the backend's choice, the workspace (from `allocate`) and the run. The
    // reference computes on oneTBB threads for as long as the problem takes: let other Python
    // threads run meanwhile. The arrays stay alive through `keep` and the caller's references.
    nb::gil_scoped_release release;
    if (exchange.is_none())
      st = expanse_run(ctx, kind, args.get());
    else if (kind == EXPANSE_OP_POWER_ATTENTION)
      st = expanse_power_attention_exchange(ctx, static_cast<const expanse_power_attention_args*>(args.get()),
                                            &python_exchange::call, &exchanging);
    else
      st = expanse_power_attention_backward_exchange(
          ctx, static_cast<const expanse_power_attention_backward_args*>(args.get()), &python_exchange::call,
          &exchanging);
  }
  std::string error = st == EXPANSE_OK ? std::string() : std::string(expanse_last_error());
  if (!exchanging.error.empty()) error += " (the exchange raised: " + exchanging.error + ")";
  // The workspace belongs to the caller's framework and may be freed after this call: never leave
  // the allocator (which points at this frame) attached to the cached context.
  expanse_context_set_allocator(ctx, nullptr, nullptr);
  const auto* raw = static_cast<const unsigned char*>(args.get());
  last = call_record{op, backend, device, stream, workspace.bytes,
                     std::vector<unsigned char>(raw, raw + expanse_op_args_size(kind)), check_finite, views};
  if (st != EXPANSE_OK) raise_status(st, workspace.error.empty() ? error : error + " (" + workspace.error + ")");
  return result;
}

nb::dict last_call() {
  nb::dict d;
  d["op"] = last.op;
  d["backend"] = last.backend;
  d["device"] = last.device;
  d["stream"] = last.stream;
  d["workspace_bytes"] = last.workspace_bytes;
  if (!last.op.empty()) {
    op_args copy(kind_of(last.op));
    std::memcpy(const_cast<void*>(copy.get()), last.args.data(), last.args.size());
    copy.describe_params(d);
  }
  d["check_finite"] = last.check_finite;
  nb::dict tensors;
  for (const auto& [name, t] : last.tensors) tensors[name.c_str()] = describe_tensor(t);
  d["tensors"] = tensors;
  return d;
}

}  // namespace

void bind_run(nb::module_& m) {
  m.def("run", &run, nb::arg("op"), nb::arg("backend"), nb::arg("device"), nb::arg("device_type"),
        nb::arg("stream"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("allocate"), nb::arg("params"),
        nb::arg("check_finite") = false, nb::arg("exchange") = nb::none(),
        "Runs one operation. inputs: {name: array or None}; outputs: {name: array (written in place), or a "
        "dtype name ('' for the library's default) to allocate with allocate(shape, dtype) in the shape the "
        "library derives}; params: {name: value} by the op's parameter table. check_finite: scan the inputs "
        "for NaN/Inf first (expanse_context_set_check_finite). exchange: for power_attention and its backward, a "
        "callable(stream) that expanse_power_attention_exchange calls once final_S/z hold the final state from "
        "zero (it must write initial_S/z), and expanse_power_attention_backward_exchange once dinitial holds the "
        "initial state's cotangent without dfinal (it must write dfinal). Returns {name: array} of the outputs.");
  m.def("last_call", &last_call,
        "What the last run() of this thread passed to the library: op, backend, device, stream, "
        "workspace_bytes, the scalars (p, scale, chunk_size, normalize, layout, check_finite) and, per "
        "tensor, data_ptr, dtype, device, shape and strides.");
}

}  // namespace expanse_py
