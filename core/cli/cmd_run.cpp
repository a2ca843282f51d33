// `expanse run <op>`: run one operation once on .npy inputs and write its outputs as .npy files.
//
// Everything about an operation comes from the library's tables (expanse_op_tensor_args,
// expanse_op_params): the file names are the tensors' names, the options the parameters' names, the
// output shapes the library's (expanse_output_shape), which also validates the inputs. No operation
// is spelled out here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "cli_options.hpp"
#include "commands.hpp"
#include "expanse/expanse.hpp"
#include "npy.hpp"

using namespace expanse_cli;
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------- RAII over the C API

class Context {
 public:
  Context(const std::string& backend, int32_t device) {
    check_status(expanse_context_create(backend.c_str(), device, &ctx_), "expanse_context_create");
    if (ctx_ == nullptr) throw std::runtime_error("expanse_context_create returned no context");
  }
  ~Context() {
    if (ctx_ != nullptr) expanse_context_destroy(ctx_);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  expanse_context* get() const { return ctx_; }

 private:
  expanse_context* ctx_ = nullptr;
};

// Memory on the context's device from expanse_malloc; freed in the destructor.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(expanse_context* ctx, size_t bytes) : ctx_(ctx) {
    if (bytes == 0) return;
    check_status(expanse_malloc(ctx, bytes, &ptr_), "expanse_malloc");
    if (ptr_ == nullptr) throw std::runtime_error("expanse_malloc returned a null pointer");
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) expanse_free(ctx_, ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  expanse_context* ctx_ = nullptr;
  void* ptr_ = nullptr;
};

size_t byte_size(const NpyArray& a) { return a.data.size(); }

// Makes expanse_tensor views of host arrays. On a device backend each tensor gets a device buffer
// (inputs copied in), and copy_back() brings outputs and in-out tensors home.
class Binder {
 public:
  Binder(expanse_context* ctx, bool on_device, int32_t device_type, int32_t device_id)
      : ctx_(ctx), on_device_(on_device), device_type_(device_type), device_id_(device_id) {}

  const expanse_tensor* input(NpyArray* a) { return a ? bind(*a, /*copy_in=*/true, false) : nullptr; }
  expanse_tensor* output(NpyArray* a) {
    if (a == nullptr) return nullptr;
    // Poison: an element the backend forgets to write shows up as NaN.
    const size_t n = a->data.size() / dtype_bytes(a->dtype);
    for (size_t i = 0; i < n; ++i) store_from_double(a->data.data(), a->dtype, i, std::nan(""));
    return bind(*a, /*copy_in=*/true, /*copy_out=*/true);
  }
  expanse_tensor* inout(NpyArray* a) { return a ? bind(*a, true, true) : nullptr; }

  // Device -> host copies of the outputs; call expanse_synchronize afterwards.
  void copy_back() {
    if (!on_device_) return;
    for (auto& s : slots_) {
      if (!s->copy_out || byte_size(*s->host) == 0) continue;
      check_status(expanse_memcpy(ctx_, s->host->data.data(), s->dev->get(), byte_size(*s->host),
                                  EXPANSE_COPY_DEVICE_TO_HOST),
                   "expanse_memcpy");
    }
  }

 private:
  struct Slot {
    NpyArray* host = nullptr;
    std::unique_ptr<DeviceBuffer> dev;
    expanse_tensor t{};
    bool copy_out = false;
  };

  expanse_tensor* bind(NpyArray& a, bool copy_in, bool copy_out) {
    auto s = std::make_unique<Slot>();
    s->host = &a;
    s->copy_out = copy_out;
    void* data = a.data.empty() ? nullptr : a.data.data();
    if (on_device_) {
      s->dev = std::make_unique<DeviceBuffer>(ctx_, byte_size(a));
      data = s->dev->get();
      if (copy_in && byte_size(a) > 0)
        check_status(expanse_memcpy(ctx_, data, a.data.data(), byte_size(a),
                                    EXPANSE_COPY_HOST_TO_DEVICE),
                     "expanse_memcpy");
    }
    check_status(expanse_tensor_make(&s->t, data, a.dtype, static_cast<int32_t>(a.shape.size()),
                                     a.shape.empty() ? nullptr : a.shape.data(),
                                     static_cast<expanse_device_type>(device_type_), device_id_),
                 "expanse_tensor_make");
    slots_.push_back(std::move(s));
    return &slots_.back()->t;
  }

  expanse_context* ctx_;
  bool on_device_;
  int32_t device_type_;
  int32_t device_id_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

// ---------------------------------------------------------------- the op's tables

struct OpTables {
  expanse_op_kind kind;
  std::vector<expanse_tensor_arg_info> tensors;
  std::vector<expanse_param_info> params;
};

OpTables tables_of(expanse_op_kind kind) { return {kind, expanse::tensor_args(kind), expanse::params(kind)}; }

// "[b,t,hq,d]" from the shape rule "b t hq d".
std::string dims_text(const char* dims) {
  std::string s = "[";
  for (const char* c = dims; *c; ++c) s += *c == ' ' ? ',' : *c;
  return s + "]";
}

// Every parameter name of every operation, once, with its help (the first op's wording).
std::vector<expanse_param_info> all_params() {
  std::vector<expanse_param_info> all;
  for (int k = 0; k < EXPANSE_OP_COUNT; ++k)
    for (const expanse_param_info& p : tables_of(static_cast<expanse_op_kind>(k)).params) {
      bool seen = false;
      for (const auto& q : all) seen = seen || std::string(q.name) == p.name;
      if (!seen) all.push_back(p);
    }
  return all;
}

// A tensor the caller's --dtype converts: the op's first input and those that must share its dtype
// ("=NAME" rules) or may be any float. Gates and states ("f32|f64") are used as read.
bool follows_dtype_option(const expanse_tensor_arg_info& t) { return std::string(t.dtypes) != "f32|f64"; }

// An optional output written only with --final-state.
bool is_final_state(const expanse_tensor_arg_info& t) { return std::string(t.name).rfind("final_", 0) == 0; }

// ---------------------------------------------------------------- options and help

const std::vector<OptionSpec>& run_options() {
  static const std::vector<OptionSpec> specs = [] {
    std::vector<OptionSpec> s = {
        {"inputs", true, "DIR", "directory holding the input files <name>.npy (required)"},
        {"outputs", true, "DIR", "directory for the output files <name>.npy (required; created if missing)"},
        {"backend", true, "NAME", "backend (default: $EXPANSE_BACKEND or \"reference\")"},
        {"device", true, "N", "device index on the backend (default 0)"},
        {"dtype", true, "T", "convert the token inputs to T (f16, bf16, f32, f64) before running"},
        {"final-state", false, "", "also write the final state (power_attention's final_S, final_z)"},
        {"check-finite", false, "", "refuse inputs holding NaN or infinity (log_g = -inf is a reset), naming\n"
                                    "the input and the index of its first such element"},
    };
    // The operations' parameters, by their names in the library's tables.
    for (const expanse_param_info& p : all_params()) {
      const char* value = p.type == EXPANSE_PARAM_LAYOUT ? "L" : p.type == EXPANSE_PARAM_DOUBLE ? "X" : "N";
      s.push_back({p.name, true, value, p.help});
    }
    s.push_back({"chunk", true, "C", "the same as --chunk_size"});
    return s;
  }();
  return specs;
}

void print_help(const ArgParser& args) {
  std::string ops;
  for (int k = 0; k < EXPANSE_OP_COUNT; ++k) {
    const OpTables op = tables_of(static_cast<expanse_op_kind>(k));
    std::string in, out, params;
    for (const auto& t : op.tensors) {
      std::string item = std::string(t.name) + " " + dims_text(t.dims);
      if (!t.required) item = "[" + item + "]";
      std::string& list = t.role == EXPANSE_ARG_INPUT ? in : out;
      list += (list.empty() ? "" : ", ") + item;
      if (t.role == EXPANSE_ARG_IN_OUT) in += (in.empty() ? "" : ", ") + item;
    }
    for (const auto& p : op.params) params += (params.empty() ? "" : ", ") + std::string("--") + p.name;
    ops += "  " + std::string(expanse_op_name(op.kind)) + "\n      in:  " + in + "\n      out: " + out +
           (params.empty() ? "" : "\n      options: " + params) + "\n";
  }
  std::printf(
      "usage: expanse run <op> --inputs DIR --outputs DIR [options]\n"
      "\n"
      "Reads the inputs of <op> from DIR/<name>.npy, runs the op once and writes each output to\n"
      "DIR/<name>.npy, printing one line per output (name, shape, dtype). Tensors in [brackets] are\n"
      "optional: an input is used when its file exists; an optional output is written (the final\n"
      "state with --final-state). Shapes follow docs/spec.md: b batch, t tokens, hq query heads, h\n"
      "key/value heads, d and e head dims, n = ceil(t / chunk_size), D = the expanded dim of phi for p,\n"
      "d and the layout; a decoding step's tensors may omit their token axis of size 1.\n"
      "\n"
      "operations and files:\n%s"
      "\n"
      "dtypes: inputs are .npy float16/float32/float64 arrays (C order), used in their file dtype.\n"
      "--dtype T converts the token inputs (all but the gates and states) to T; gates and states are\n"
      "used as read when float32/float64 and converted to float32 otherwise. Outputs have the dtype the\n"
      "library writes by default: token outputs that of the inputs, states and accumulators f32 (f64\n"
      "for f64 inputs); in-place states keep theirs. numpy has no bfloat16: bf16 outputs are written as\n"
      "float32 files (exactly). Outputs are filled with NaN before the run, so an element a backend\n"
      "does not write shows up as NaN.\n"
      "\n"
      "options:\n%s"
      "\n"
      "example:\n"
      "  expanse run power_attention --inputs in --outputs out --p 2 --final-state\n"
      "  expanse run power_attention --inputs in --outputs out --p 2 --chunk_size 64 --check-finite\n",
      ops.c_str(), args.options_help().c_str());
}

// ---------------------------------------------------------------- the run

struct Settings {
  expanse_op_kind op;
  std::string op_name;
  fs::path in_dir, out_dir;
  int32_t device = 0;
  bool has_dtype = false;
  expanse_dtype dtype = EXPANSE_F32;
  bool final_state = false;
  bool check_finite = false;
};

// Holds the host arrays (inputs and outputs) of one run; addresses are stable.
class Arrays {
 public:
  explicit Arrays(const Settings& s) : s_(s) {}

  // DIR/<name>.npy, or nullptr when it does not exist and is optional; converted as the tensor's
  // dtype rule and --dtype say.
  NpyArray* load(const expanse_tensor_arg_info& t) {
    const fs::path file = s_.in_dir / (std::string(t.name) + ".npy");
    std::error_code ec;
    if (fs::status(file, ec).type() == fs::file_type::not_found) {
      if (!t.required) return nullptr;
      throw std::runtime_error(s_.op_name + " needs the input file " + file.string() + ", which does not exist");
    }
    // Anything else that is wrong with the path (a FIFO, a symbolic link loop) npy_read reports.
    auto a = std::make_unique<NpyArray>(npy_read(file.string()));
    if (follows_dtype_option(t)) {
      if (s_.has_dtype && a->dtype != s_.dtype) *a = convert_array(*a, s_.dtype);
    } else if (a->dtype != EXPANSE_F32 && a->dtype != EXPANSE_F64) {
      *a = convert_array(*a, EXPANSE_F32);
    }
    arrays_.push_back(std::move(a));
    return arrays_.back().get();
  }

  // A new output array (the Binder poisons it).
  NpyArray* output(const std::string& name, std::vector<int64_t> shape, expanse_dtype dtype) {
    auto a = std::make_unique<NpyArray>();
    a->dtype = dtype;
    a->shape = std::move(shape);
    const int64_t n = checked_numel(a->shape, "output " + name + " of shape " + shape_to_string(a->shape),
                                    dtype_bytes(dtype));
    const size_t bytes = static_cast<size_t>(n) * dtype_bytes(dtype);
    try {
      a->data.resize(bytes);
    } catch (const std::bad_alloc&) {
      throw std::runtime_error("output " + name + " of shape " + shape_to_string(a->shape) + " needs " +
                               std::to_string(bytes) + " bytes of host memory, which could not be allocated");
    }
    outputs_.emplace_back(name, a.get());
    arrays_.push_back(std::move(a));
    return arrays_.back().get();
  }
  // An in-place array written back under `name`.
  void also_output(const std::string& name, NpyArray* a) {
    if (a) outputs_.emplace_back(name, a);
  }
  const std::vector<std::pair<std::string, NpyArray*>>& outputs() const { return outputs_; }

 private:
  const Settings& s_;
  std::vector<std::unique_ptr<NpyArray>> arrays_;
  std::vector<std::pair<std::string, NpyArray*>> outputs_;
};

// The op's args struct, filled by name through the tables.
class Args {
 public:
  explicit Args(expanse_op_kind kind) : bytes_(expanse_op_args_size(kind) + 16) {
    check_status(expanse_op_args_init(kind, get()), "expanse_op_args_init");
  }
  void* get() { return bytes_.data() + (16 - reinterpret_cast<uintptr_t>(bytes_.data()) % 16) % 16; }
  void set_tensor(const expanse_tensor_arg_info& t, const expanse_tensor* view) {
    std::memcpy(static_cast<char*>(get()) + t.offset, &view, sizeof(view));
  }
  // The parameter from its option's text (when given; else the library's default stays).
  void set_param(const expanse_param_info& p, const std::string& text) {
    char* at = static_cast<char*>(get()) + p.offset;
    const std::string what = "--" + std::string(p.name);
    if (p.type == EXPANSE_PARAM_INT32) {
      const int32_t v = std::string(p.name) == "normalize" ? (parse_bool(text, what) ? 1 : 0)
                                                           : static_cast<int32_t>(parse_int(text, what, INT32_MIN, INT32_MAX));
      std::memcpy(at, &v, sizeof(v));
    } else if (p.type == EXPANSE_PARAM_INT64) {
      const int64_t v = parse_chunk(text, what, /*allow_auto=*/p.default_value == EXPANSE_CHUNK_AUTO);
      std::memcpy(at, &v, sizeof(v));
    } else if (p.type == EXPANSE_PARAM_DOUBLE) {
      const double v = parse_double(text, what);
      std::memcpy(at, &v, sizeof(v));
    } else {
      const expanse_layout v = parse_layout(text, what);
      std::memcpy(at, &v, sizeof(v));
    }
  }

 private:
  std::vector<unsigned char> bytes_;
};

// A workspace from expanse_malloc when the op asks for one (expanse_context_set_allocator).
struct Workspace {
  expanse_context* ctx;
  std::unique_ptr<DeviceBuffer> buffer;
  static void* grow(void* self, size_t bytes) noexcept {
    auto& w = *static_cast<Workspace*>(self);
    try {
      w.buffer = std::make_unique<DeviceBuffer>(w.ctx, bytes);
      return w.buffer->get();
    } catch (const std::exception&) {
      return nullptr;
    }
  }
};

void run_op(const Settings& s, const OpTables& op, Args& args, expanse_context* ctx, Binder& bind, Arrays& io) {
  // Inputs (and in-place states) first: the output shapes derive from them.
  std::vector<std::pair<const expanse_tensor_arg_info*, NpyArray*>> in_place;
  for (const auto& t : op.tensors) {
    if (t.role == EXPANSE_ARG_OUTPUT) continue;
    NpyArray* a = io.load(t);
    if (t.role == EXPANSE_ARG_IN_OUT) {
      in_place.emplace_back(&t, a);
    } else {
      args.set_tensor(t, bind.input(a));
    }
  }
  for (auto& [t, a] : in_place) {
    args.set_tensor(*t, bind.inout(a));
    io.also_output(t->name, a);
  }
  for (int32_t i = 0; i < int32_t(op.tensors.size()); ++i) {
    const expanse_tensor_arg_info& t = op.tensors[size_t(i)];
    if (t.role != EXPANSE_ARG_OUTPUT || (is_final_state(t) && !s.final_state)) continue;
    int32_t ndim = 0, dtype = 0;
    int64_t shape[EXPANSE_MAX_DIMS] = {};
    check_status(expanse_output_shape(op.kind, args.get(), i, &ndim, shape, &dtype), "expanse_output_shape");
    args.set_tensor(t, bind.output(io.output(t.name, {shape, shape + ndim}, static_cast<expanse_dtype>(dtype))));
  }
  // One call: validation, the backend's choice, the workspace (through the allocator) and the run.
  Workspace workspace{ctx, nullptr};
  check_status(expanse_context_set_allocator(ctx, &Workspace::grow, &workspace), "expanse_context_set_allocator");
  const expanse_status st = expanse_run(ctx, op.kind, args.get());
  const std::string error = st == EXPANSE_OK ? std::string() : expanse_last_error();
  expanse_context_set_allocator(ctx, nullptr, nullptr);
  if (st != EXPANSE_OK) throw LibraryError(st, error);
  bind.copy_back();
  check_status(expanse_synchronize(ctx), "expanse_synchronize");
}

// Throws unless `dir` is a readable directory, with the system's reason (a symbolic link loop is
// not "does not exist").
void check_input_dir(const fs::path& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found)
    throw std::runtime_error("input directory " + dir.string() + " does not exist");
  if (ec) throw std::runtime_error("input directory " + dir.string() + " cannot be read: " + ec.message());
  if (st.type() != fs::file_type::directory)
    throw std::runtime_error("--inputs " + dir.string() + " is not a directory");
}

}  // namespace

int cmd_run(int argc, char** argv) {
  ArgParser args("run", run_options());
  args.parse(argc, argv);
  if (args.help_requested()) {
    print_help(args);
    return 0;
  }
  const auto& pos = args.positional();
  if (pos.empty()) throw UsageError("expanse run needs an operation: one of " + op_names_list());
  if (pos.size() > 1) throw UsageError("expanse run takes one operation, got also '" + pos[1] + "'");

  Settings s;
  s.op = parse_op(pos[0], "operation");
  s.op_name = expanse_op_name(s.op);
  const OpTables op = tables_of(s.op);
  if (!args.has("inputs")) throw UsageError("expanse run needs --inputs DIR");
  if (!args.has("outputs")) throw UsageError("expanse run needs --outputs DIR");
  s.in_dir = args.get_string("inputs", "");
  s.out_dir = args.get_string("outputs", "");
  if (s.in_dir.empty()) throw UsageError("--inputs needs a directory name");
  if (s.out_dir.empty()) throw UsageError("--outputs needs a directory name");
  s.device = static_cast<int32_t>(args.get_int("device", 0, 0, INT32_MAX));
  s.has_dtype = args.has("dtype");
  if (s.has_dtype) s.dtype = parse_dtype(*args.value("dtype"), "--dtype");
  s.final_state = args.get_flag("final-state");
  s.check_finite = args.get_flag("check-finite");
  if (args.has("chunk") && args.has("chunk_size")) throw UsageError("give --chunk_size or --chunk, not both");

  // The op's parameters from their options; options the op does not read are most likely a
  // mistake: say so, but run.
  Args op_args(s.op);
  bool final_states = false;
  for (const auto& t : op.tensors) final_states = final_states || is_final_state(t);
  for (const auto& name : args.given()) {
    if (name == "inputs" || name == "outputs" || name == "backend" || name == "device" || name == "dtype" ||
        name == "check-finite" || (name == "final-state" && final_states))
      continue;
    const std::string param = name == "chunk" ? "chunk_size" : name;
    bool used = false;
    for (const auto& p : op.params)
      if (param == p.name) {
        op_args.set_param(p, *args.value(name));
        used = true;
      }
    if (!used) std::fprintf(stderr, "expanse: warning: --%s is not used by %s\n", name.c_str(), s.op_name.c_str());
  }

  check_input_dir(s.in_dir);
  // A file no tensor of the op reads is most likely misnamed (e.g. S0.npy for initial_S.npy): say so.
  std::error_code dir_error;
  for (const auto& entry : fs::directory_iterator(s.in_dir, dir_error)) {
    if (entry.path().extension() != ".npy") continue;
    const std::string stem = entry.path().stem().string();
    bool read = false;
    for (const auto& t : op.tensors) read = read || (t.role != EXPANSE_ARG_OUTPUT && stem == t.name);
    if (!read) {
      std::string names;
      for (const auto& t : op.tensors)
        if (t.role != EXPANSE_ARG_OUTPUT) names += (names.empty() ? "" : ", ") + std::string(t.name);
      std::fprintf(stderr, "expanse: warning: %s is not an input of %s (its inputs: %s); it is not read\n",
                   entry.path().filename().string().c_str(), s.op_name.c_str(), names.c_str());
    }
  }

  const char* def_backend = expanse_default_backend();
  const std::string backend = args.get_string("backend", def_backend ? def_backend : "reference");
  Context ctx(backend, s.device);
  const int32_t device_type = expanse_context_device_type(ctx.get());
  if (s.check_finite)
    check_status(expanse_context_set_check_finite(ctx.get(), 1), "expanse_context_set_check_finite");

  Arrays io(s);
  {
    Binder bind(ctx.get(), device_type != EXPANSE_DEVICE_CPU, device_type, s.device);
    run_op(s, op, op_args, ctx.get(), bind, io);
  }  // device buffers are freed here, before the context

  std::error_code ec;
  fs::create_directories(s.out_dir, ec);
  if (ec || !fs::is_directory(s.out_dir))
    throw std::runtime_error("cannot create the output directory " + s.out_dir.string() +
                             (ec ? ": " + ec.message() : std::string()));
  for (const auto& [name, arr] : io.outputs()) {
    const fs::path file = s.out_dir / (name + ".npy");
    npy_write(file.string(), *arr);
    std::printf("%-7s %-22s %s%s -> %s\n", name.c_str(), shape_to_string(arr->shape).c_str(),
                dtype_to_string(arr->dtype), arr->dtype == EXPANSE_BF16 ? " (written as f32)" : "",
                file.string().c_str());
  }
  std::fflush(stdout);
  return 0;
}
