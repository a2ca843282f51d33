// run(): one operation of the C ABI on framework arrays. The Python layer (expanse/_ops.py) decides
// defaults, output shapes and dtypes; this file turns its arrays into expanse_tensor views, lets the
// library validate the whole call before any output memory exists, has the caller's framework
// allocate the outputs and the workspace, and runs the op on the caller's stream.
#include <cstdint>
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

struct op_spec {
  const char* name;
  expanse_op_kind kind;
  std::vector<std::string> inputs, outputs;  // the *_args field names, as Python passes them
};

const std::vector<op_spec>& op_specs() {
  static const std::vector<op_spec> specs = {
      {"sympow_expand", EXPANSE_OP_SYMPOW_EXPAND, {"x"}, {"out"}},
      {"update_state", EXPANSE_OP_UPDATE_STATE, {"k", "v", "log_g"}, {"S", "z"}},
      {"discumsum", EXPANSE_OP_DISCUMSUM, {"X", "A", "Y_init"}, {"Y"}},
      {"query_state", EXPANSE_OP_QUERY_STATE, {"q", "S", "z", "log_g", "y", "l", "rowmax"}, {"o"}},
      {"chunk_attention", EXPANSE_OP_CHUNK_ATTENTION, {"q", "k", "v", "log_g"}, {"y", "l", "rowmax"}},
      {"power_attention", EXPANSE_OP_POWER_ATTENTION, {"q", "k", "v", "log_g", "initial_S", "initial_z"},
       {"o", "final_S", "final_z"}},
      // S and z are updated in place: the caller passes them as (writable) outputs.
      {"power_attention_step", EXPANSE_OP_POWER_ATTENTION_STEP, {"q", "k", "v", "log_g"}, {"S", "z", "o"}},
  };
  return specs;
}

const op_spec& spec_of(const std::string& name) {
  for (const op_spec& s : op_specs())
    if (name == s.name) return s;
  throw nb::value_error(("unknown operation '" + name + "'").c_str());
}

struct op_params {
  int32_t p;
  double scale;
  int64_t chunk_size;
  bool normalize;
  expanse_layout layout;
};

// The views of one call by argument name. std::map keeps the addresses of its values stable, so the
// args structs can point at them while the placeholders are replaced by real outputs.
struct tensor_table {
  std::map<std::string, expanse_tensor> views;
  const expanse_tensor* in(const char* name) const {
    auto it = views.find(name);
    return it == views.end() ? nullptr : &it->second;
  }
  expanse_tensor* out(const char* name) {
    auto it = views.find(name);
    return it == views.end() ? nullptr : &it->second;
  }
};

struct any_args {
  expanse_sympow_expand_args sympow_expand;
  expanse_update_state_args update_state;
  expanse_discumsum_args discumsum;
  expanse_query_state_args query_state;
  expanse_chunk_attention_args chunk_attention;
  expanse_power_attention_args power_attention;
  expanse_power_attention_step_args power_attention_step;
};

const void* fill_args(expanse_op_kind kind, tensor_table& t, const op_params& prm, any_args& all) {
  switch (kind) {
    case EXPANSE_OP_SYMPOW_EXPAND: {
      auto& a = all.sympow_expand;
      expanse_sympow_expand_args_init(&a);
      a.x = t.in("x"); a.out = t.out("out"); a.p = prm.p; a.layout = prm.layout;
      return &a;
    }
    case EXPANSE_OP_UPDATE_STATE: {
      auto& a = all.update_state;
      expanse_update_state_args_init(&a);
      a.k = t.in("k"); a.v = t.in("v"); a.log_g = t.in("log_g"); a.S = t.out("S"); a.z = t.out("z");
      a.p = prm.p; a.chunk_size = prm.chunk_size; a.layout = prm.layout;
      return &a;
    }
    case EXPANSE_OP_DISCUMSUM: {
      auto& a = all.discumsum;
      expanse_discumsum_args_init(&a);
      a.X = t.in("X"); a.A = t.in("A"); a.Y_init = t.in("Y_init"); a.Y = t.out("Y");
      return &a;
    }
    case EXPANSE_OP_QUERY_STATE: {
      auto& a = all.query_state;
      expanse_query_state_args_init(&a);
      a.q = t.in("q"); a.S = t.in("S"); a.z = t.in("z"); a.log_g = t.in("log_g");
      a.y = t.in("y"); a.l = t.in("l"); a.rowmax = t.in("rowmax"); a.o = t.out("o");
      a.p = prm.p; a.scale = prm.scale; a.chunk_size = prm.chunk_size; a.normalize = prm.normalize;
      a.layout = prm.layout;
      return &a;
    }
    case EXPANSE_OP_CHUNK_ATTENTION: {
      auto& a = all.chunk_attention;
      expanse_chunk_attention_args_init(&a);
      a.q = t.in("q"); a.k = t.in("k"); a.v = t.in("v"); a.log_g = t.in("log_g");
      a.y = t.out("y"); a.l = t.out("l"); a.rowmax = t.out("rowmax");
      a.p = prm.p; a.scale = prm.scale; a.chunk_size = prm.chunk_size;
      return &a;
    }
    case EXPANSE_OP_POWER_ATTENTION: {
      auto& a = all.power_attention;
      expanse_power_attention_args_init(&a);
      a.q = t.in("q"); a.k = t.in("k"); a.v = t.in("v"); a.log_g = t.in("log_g");
      a.initial_S = t.in("initial_S"); a.initial_z = t.in("initial_z");
      a.o = t.out("o"); a.final_S = t.out("final_S"); a.final_z = t.out("final_z");
      a.p = prm.p; a.scale = prm.scale; a.chunk_size = prm.chunk_size; a.normalize = prm.normalize;
      a.layout = prm.layout;
      return &a;
    }
    case EXPANSE_OP_POWER_ATTENTION_STEP: {
      auto& a = all.power_attention_step;
      expanse_power_attention_step_args_init(&a);
      a.q = t.in("q"); a.k = t.in("k"); a.v = t.in("v"); a.log_g = t.in("log_g");
      a.S = t.out("S"); a.z = t.out("z"); a.o = t.out("o");
      a.p = prm.p; a.scale = prm.scale; a.normalize = prm.normalize; a.layout = prm.layout;
      return &a;
    }
    case EXPANSE_OP_COUNT: break;
  }
  throw nb::value_error("unknown operation kind");
}

// What the last run() of this thread handed to the library: lets tests check that no array was
// copied (data pointers), which stream was used and which scalars the Python defaults became. Plain
// C++ data, no Python objects, so that it can outlive the interpreter in a thread_local.
struct call_record {
  std::string op, backend;
  int32_t device = 0;
  uintptr_t stream = 0;
  size_t workspace_bytes = 0;
  op_params params{};
  bool check_finite = false;
  std::map<std::string, expanse_tensor> tensors;
};
thread_local call_record last;

bool is_spec(nb::handle value) { return nb::isinstance<nb::tuple>(value); }

// When the Python layer cannot derive the output shapes (malformed inputs: q of rank 3, ...), the
// library must still see every required output, or it would report the missing output rather than
// the malformed input. Each one gets an empty stand-in of rank 1, which no valid call accepts.
// Returns whether any was added.
bool add_stand_ins(expanse_op_kind kind, tensor_table& table, placeholder_space& space, int32_t device_type,
                   int32_t device) {
  const expanse_tensor_arg_info* args = nullptr;
  const int32_t count = expanse_op_tensor_args(kind, &args);
  bool added = false;
  for (int32_t i = 0; i < count; ++i) {
    if (args[i].role == EXPANSE_ARG_INPUT || !args[i].required || table.views.count(args[i].name)) continue;
    table.views[args[i].name] = space.make({0}, "f32", device_type, device);
    added = true;
  }
  return added;
}

nb::dict run(const std::string& op, const std::string& backend, int32_t device, int32_t device_type,
             uintptr_t stream, nb::dict inputs, nb::dict outputs, nb::callable allocate, int32_t p, double scale,
             int64_t chunk_size, bool normalize, std::pair<int32_t, int32_t> layout, bool check_finite) {
  const op_spec& spec = spec_of(op);
  auto known = [](const std::vector<std::string>& names, const std::string& n) {
    for (const auto& k : names)
      if (k == n) return true;
    return false;
  };
  expanse_context* ctx = context_for(backend, device);
  // The contexts are cached and shared by every call of this thread: set the check on each call.
  check(expanse_context_set_check_finite(ctx, check_finite ? 1 : 0));

  array_keeper keep;
  tensor_table table;
  for (auto [key, value] : inputs) {
    const std::string name = nb::cast<std::string>(key);
    if (!known(spec.inputs, name)) throw nb::value_error((op + ": unknown input '" + name + "'").c_str());
    if (!value.is_none()) table.views[name] = keep.view(name, value, /*writable=*/false);
  }
  std::vector<std::pair<std::string, nb::tuple>> to_allocate;
  nb::dict result;
  for (auto [key, value] : outputs) {
    const std::string name = nb::cast<std::string>(key);
    if (!known(spec.outputs, name)) throw nb::value_error((op + ": unknown output '" + name + "'").c_str());
    if (value.is_none()) continue;
    if (is_spec(value)) {  // (shape, dtype): allocated below, once the library accepted the call
      to_allocate.emplace_back(name, nb::borrow<nb::tuple>(value));
    } else {
      table.views[name] = keep.view(name, value, /*writable=*/true);
      result[name.c_str()] = value;
    }
  }
  placeholder_space space(table.views);
  for (auto& [name, s] : to_allocate)
    table.views[name] = space.make(nb::cast<std::vector<int64_t>>(s[0]), nb::cast<std::string>(s[1]), device_type,
                                   device);
  const bool stand_ins = add_stand_ins(spec.kind, table, space, device_type, device);

  const op_params prm{p, scale, chunk_size, normalize, {layout.first, layout.second}};
  any_args all{};
  const void* args = fill_args(spec.kind, table, prm, all);

  // Validation and the backend's support question come first, so that bad input or an unsupported
  // problem costs no allocation (an absurd p or d could otherwise ask for gigabytes).
  check(expanse_supports(ctx, spec.kind, args, nullptr, 0));
  if (stand_ins)  // never run with an output that has no memory
    raise_status(EXPANSE_ERROR_INTERNAL, op + ": the library accepted a call whose output shapes the Python "
                                              "layer could not derive");

  for (auto& [name, s] : to_allocate) {
    nb::object array = allocate(s[0], s[1]);
    expanse_tensor real = keep.view(name, array, /*writable=*/true);
    table.views[name] = real;
    result[name.c_str()] = array;
  }

  check(expanse_context_set_stream(ctx, reinterpret_cast<void*>(stream)));
  size_t bytes = 0;
  check(expanse_workspace_size(ctx, spec.kind, args, &bytes));
  if (bytes > 0) {
    nb::object ws = allocate(nb::make_tuple(static_cast<int64_t>(bytes)), "u8");
    auto raw = keep.bytes_of("workspace", ws, /*writable=*/true);
    if (raw.bytes < bytes || raw.device_type != device_type)
      raise_status(EXPANSE_ERROR_WORKSPACE, op + ": the workspace allocated for backend '" + backend +
                                                "' is too small or on another device");
    check(expanse_context_set_workspace(ctx, raw.data, raw.bytes));
  }

  last = call_record{op, backend, device, stream, bytes, prm, check_finite, table.views};
  expanse_status st;
  {
    // The reference computes on oneTBB threads for as long as the problem takes: let other Python
    // threads run meanwhile. The arrays stay alive through `keep` and the caller's references.
    nb::gil_scoped_release release;
    st = expanse_run(ctx, spec.kind, args);
  }
  // The workspace belongs to the caller's framework and may be freed after this call: never leave
  // it attached to the cached context.
  if (bytes > 0) expanse_context_set_workspace(ctx, nullptr, 0);
  check(st);
  return result;
}

nb::dict last_call() {
  nb::dict d;
  d["op"] = last.op;
  d["backend"] = last.backend;
  d["device"] = last.device;
  d["stream"] = last.stream;
  d["workspace_bytes"] = last.workspace_bytes;
  d["p"] = last.params.p;
  d["scale"] = last.params.scale;
  d["chunk_size"] = last.params.chunk_size;
  d["normalize"] = last.params.normalize;
  d["layout"] = nb::make_tuple(last.params.layout.kind, last.params.layout.d_tile);
  d["check_finite"] = last.check_finite;
  nb::dict tensors;
  for (const auto& [name, t] : last.tensors) tensors[name.c_str()] = describe_tensor(t);
  d["tensors"] = tensors;
  return d;
}

}  // namespace

void bind_run(nb::module_& m) {
  m.def("run", &run, nb::arg("op"), nb::arg("backend"), nb::arg("device"), nb::arg("device_type"),
        nb::arg("stream"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("allocate"), nb::arg("p") = 2,
        nb::arg("scale") = 0.0, nb::arg("chunk_size") = 0, nb::arg("normalize") = true,
        nb::arg("layout") = std::make_pair(0, 0), nb::arg("check_finite") = false,
        "Runs one operation. inputs: {name: array or None}; outputs: {name: array (written in place) or "
        "(shape, dtype) to allocate with allocate(shape, dtype)}. check_finite: scan the inputs for "
        "NaN/Inf first (expanse_context_set_check_finite). Returns {name: array} of the outputs.");
  m.def("last_call", &last_call,
        "What the last run() of this thread passed to the library: op, backend, device, stream, "
        "workspace_bytes, the scalars (p, scale, chunk_size, normalize, layout, check_finite) and, per "
        "tensor, data_ptr, dtype, device, shape and strides.");
}

}  // namespace expanse_py
