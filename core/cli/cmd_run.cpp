// `expanse run <op>`: run one operation once on .npy inputs and write its outputs as .npy files.
//
// Everything about an operation comes from the library's tables (expanse_op_tensor_args,
// expanse_op_params): each op is a subcommand, its file names are the tensors' names, its options
// the parameters' names, types, help and defaults, the output shapes the library's
// (expanse_output_shape), which also validates the inputs. No operation is spelled out here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
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

// Every parameter of every operation, once by name (the first op's).
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


// ---------------------------------------------------------------- the run

// The options of `expanse run OP` but the op's parameters, as given.
struct Settings {
  std::string op_name;
  std::string in_dir, out_dir, backend;
  int32_t device = 0;
  std::optional<expanse_dtype> dtype;
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
    const fs::path file = fs::path(s_.in_dir) / (std::string(t.name) + ".npy");
    std::error_code ec;
    if (fs::status(file, ec).type() == fs::file_type::not_found) {
      if (!t.required) return nullptr;
      throw std::runtime_error(s_.op_name + " needs the input file " + file.string() + ", which does not exist");
    }
    // Anything else that is wrong with the path (a FIFO, a symbolic link loop) npy_read reports.
    auto a = std::make_unique<NpyArray>(npy_read(file.string()));
    if (follows_dtype_option(t)) {
      if (s_.dtype && a->dtype != *s_.dtype) *a = convert_array(*a, *s_.dtype);
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
  // A parameter (of the type the table gives).
  template <class T>
  void set(const expanse_param_info& p, const T& value) {
    std::memcpy(static_cast<char*>(get()) + p.offset, &value, sizeof(value));
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

// ---------------------------------------------------------------- the command line

// `expanse run OP` for one operation: its tables, its args struct (which the options of its
// parameters fill as they are parsed) and the options given that it does not read.
struct Operation {
  explicit Operation(expanse_op_kind kind) : op(tables_of(kind)), args(kind) {}
  OpTables op;
  Args args;
  CLI::App* app = nullptr;
  std::vector<std::string> unused;
};

struct RunCommand {
  Settings settings;
  std::vector<std::unique_ptr<Operation>> ops;
};

// "in:  q [b,t,hq,d], [log_g [b,t,h]]\nout: o [b,t,hq,e]": the op's files, optional ones in brackets.
std::string files_text(const OpTables& op) {
  std::string in, out;
  for (const auto& t : op.tensors) {
    std::string item = std::string(t.name) + " " + dims_text(t.dims);
    if (!t.required) item = "[" + item + "]";
    std::string& list = t.role == EXPANSE_ARG_INPUT ? in : out;
    list += (list.empty() ? "" : ", ") + item;
    if (t.role == EXPANSE_ARG_IN_OUT) in += (in.empty() ? "" : ", ") + item;
  }
  return "in:  " + in + "\nout: " + out;
}

// "--p"; "--chunk_size,--chunk" (the name the command has always read too).
std::string option_names(const expanse_param_info& p) {
  const std::string name = "--" + std::string(p.name);
  return name == "--chunk_size" ? name + ",--chunk" : name;
}

// A parameter's default as its option reads it: "2", "auto", "sympow".
std::string default_text(const expanse_param_info& p) {
  if (p.type == EXPANSE_PARAM_LAYOUT)
    return p.default_value == EXPANSE_LAYOUT_TENSOR  ? "tensor"
           : p.default_value == EXPANSE_LAYOUT_TILED ? "tiled"
                                                     : "sympow";
  if (p.type == EXPANSE_PARAM_INT64 && p.default_value == EXPANSE_CHUNK_AUTO) return "auto";
  std::ostringstream text;
  text << p.default_value;
  return text.str();
}

// The option of parameter p, of the type its table gives; it writes the value into args.
void add_param_option(CLI::App* sub, const expanse_param_info& p, Args& args) {
  const std::string name = "--" + std::string(p.name), names = option_names(p);
  const std::string help = std::string(p.help) + " (default " + default_text(p) + ")";
  if (p.type == EXPANSE_PARAM_INT32 && name == "--normalize") {
    sub->add_option_function<bool>(names, [&args, p](bool v) { args.set(p, int32_t(v)); }, help)->type_name("0|1");
  } else if (p.type == EXPANSE_PARAM_INT32) {
    sub->add_option_function<int32_t>(names, [&args, p](int32_t v) { args.set(p, v); }, help)->type_name("N");
  } else if (p.type == EXPANSE_PARAM_INT64) {
    const bool allow_auto = p.default_value == EXPANSE_CHUNK_AUTO;
    sub->add_option_function<std::string>(
           names, [&args, p, name, allow_auto](const std::string& v) { args.set(p, parse_chunk(v, name, allow_auto)); },
           help)->type_name(allow_auto ? "auto|C" : "C");
  } else if (p.type == EXPANSE_PARAM_DOUBLE) {
    sub->add_option_function<double>(names, [&args, p](double v) { args.set(p, v); }, help)->type_name("X")->check(
        finite_number());
  } else if (p.type == EXPANSE_PARAM_LAYOUT) {
    sub->add_option_function<std::string>(
           names, [&args, p, name](const std::string& v) { args.set(p, parse_layout(v, name)); }, help)->type_name("L");
  } else {
    throw std::logic_error("expanse run: parameter " + name + " has an unknown type");
  }
}

// The options of `expanse run OP`: the shared ones, then the op's parameters from the library's
// table. The parameters of other ops (and --final-state where the op has no final state) are
// accepted with a warning, not listed, so that one set of options serves every op.
void add_options(CLI::App* sub, Operation& o, Settings& s) {
  sub->add_option("--inputs", s.in_dir, "directory holding the input files <name>.npy (required)")->type_name("DIR");
  sub->add_option("--outputs", s.out_dir, "directory for the output files <name>.npy (required; created if missing)")
      ->type_name("DIR");
  sub->add_option("--backend", s.backend, "backend (default: $EXPANSE_BACKEND or \"reference\")")->type_name("NAME");
  sub->add_option("--device", s.device, "device index on the backend (default 0)")->type_name("N")->check(
      in_range(0, INT32_MAX));
  sub->add_option_function<std::string>(
         "--dtype", [&s](const std::string& text) { s.dtype = parse_dtype(text, "--dtype"); },
         "convert the token inputs to T (f16, bf16, f32, f64) before running")->type_name("T");
  std::string finals;
  for (const auto& t : o.op.tensors)
    if (is_final_state(t)) finals += (finals.empty() ? "" : ", ") + std::string(t.name);
  if (!finals.empty()) sub->add_flag("--final-state", s.final_state, "also write the final state (" + finals + ")");
  else sub->add_flag_function("--final-state", [&o](int64_t) { o.unused.push_back("--final-state"); })->group("");
  sub->add_flag("--check-finite", s.check_finite,
                "refuse inputs holding NaN or infinity (log_g = -inf is a reset), naming\n"
                "the input and the index of its first such element");
  for (const expanse_param_info& p : all_params()) {
    bool read = false;
    for (const expanse_param_info& q : o.op.params)
      if (std::string(q.name) == p.name) {
        add_param_option(sub, q, o.args);
        read = true;
      }
    if (!read)
      sub->add_option_function<std::string>(option_names(p), [&o, p](const std::string&) {
           o.unused.push_back("--" + std::string(p.name));
         })->group("");
  }
}

const char kFooter[] =
    "OP reads each input from --inputs DIR/<name>.npy and writes each output to --outputs\n"
    "DIR/<name>.npy, printing one line per output (name, shape, dtype). Tensors in [brackets] are\n"
    "optional: an input is used when its file exists; an optional output is written (the final\n"
    "state with --final-state). Shapes follow docs/spec.md: b batch, t tokens, hq query heads, h\n"
    "key/value heads, d and e head dims, n = ceil(t / chunk_size), D = the expanded dim of phi for p,\n"
    "d and the layout; a decoding step's tensors may omit their token axis of size 1.\n"
    "\n"
    "dtypes: inputs are .npy float16/float32/float64 arrays (C order), used in their file dtype.\n"
    "--dtype T converts the token inputs (all but the gates and states) to T; gates and states are\n"
    "used as read when float32/float64 and converted to float32 otherwise. Outputs have the dtype the\n"
    "library writes by default: token outputs that of the inputs, states and accumulators f32 (f64\n"
    "for f64 inputs); in-place states keep theirs. numpy has no bfloat16: bf16 outputs are written as\n"
    "float32 files (exactly). Outputs are filled with NaN before the run, so an element a backend\n"
    "does not write shows up as NaN.\n"
    "\n"
    "examples:\n"
    "  expanse run power_attention --inputs in --outputs out --p 2 --final-state\n"
    "  expanse run power_attention --inputs in --outputs out --p 2 --chunk_size 64 --check-finite\n";

// ---------------------------------------------------------------- the run

int run(Settings s, Operation& o) {
  const OpTables& op = o.op;
  s.op_name = expanse_op_name(op.kind);
  if (s.in_dir.empty()) throw UsageError("expanse run needs --inputs DIR");
  if (s.out_dir.empty()) throw UsageError("expanse run needs --outputs DIR");
  // Options the op does not read are most likely a mistake: say so, but run.
  for (const std::string& name : o.unused)
    std::fprintf(stderr, "expanse: warning: %s is not used by %s\n", name.c_str(), s.op_name.c_str());

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
  const std::string backend = !s.backend.empty() ? s.backend : def_backend ? def_backend : "reference";
  Context ctx(backend, s.device);
  const int32_t device_type = expanse_context_device_type(ctx.get());
  if (s.check_finite)
    check_status(expanse_context_set_check_finite(ctx.get(), 1), "expanse_context_set_check_finite");

  Arrays io(s);
  {
    Binder bind(ctx.get(), device_type != EXPANSE_DEVICE_CPU, device_type, s.device);
    run_op(s, op, o.args, ctx.get(), bind, io);
  }  // device buffers are freed here, before the context

  const fs::path out_dir = s.out_dir;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir))
    throw std::runtime_error("cannot create the output directory " + out_dir.string() +
                             (ec ? ": " + ec.message() : std::string()));
  for (const auto& [name, arr] : io.outputs()) {
    const fs::path file = out_dir / (name + ".npy");
    npy_write(file.string(), *arr);
    std::printf("%-7s %-22s %s%s -> %s\n", name.c_str(), shape_to_string(arr->shape).c_str(),
                dtype_to_string(arr->dtype), arr->dtype == EXPANSE_BF16 ? " (written as f32)" : "",
                file.string().c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "run one operation on .npy inputs and write .npy outputs");
  set_usage(cmd, "OP --inputs DIR --outputs DIR [options]");
  cmd->footer(kFooter);
  cmd->require_subcommand(0, 1);
  // A name that is no operation (those are the subcommands), or an option's value before the operation.
  cmd->add_option_function<std::string>("OP", [cmd](const std::string& name) {
       const std::vector<std::string> before = cmd->remaining();
       if (!before.empty())
         throw UsageError("expanse run takes the operation first, then its options (got " + before.front() +
                          " before the operation)");
       throw UsageError("unknown operation '" + name + "': expected one of " + op_names_list());
     })->group("");
  auto run_cmd = std::make_shared<RunCommand>();
  for (int k = 0; k < EXPANSE_OP_COUNT; ++k) {
    auto o = std::make_unique<Operation>(static_cast<expanse_op_kind>(k));
    const std::string name = expanse_op_name(o->op.kind);
    o->app = cmd->add_subcommand(name, files_text(o->op));
    o->app->group("Operations (expanse run OP --help: its options)")->ignore_case();
    std::string dashed = name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (dashed != name) o->app->alias(dashed);
    set_usage(o->app, "--inputs DIR --outputs DIR [options]");
    add_options(o->app, *o, run_cmd->settings);
    run_cmd->ops.push_back(std::move(o));
  }
  return {cmd, [run_cmd] {
            for (auto& o : run_cmd->ops)
              if (o->app->parsed()) return run(run_cmd->settings, *o);
            throw UsageError("expanse run needs an operation: one of " + op_names_list());
          }};
}
