// `expanse run <op>`: run one operation once on .npy inputs and write its outputs as .npy files.
//
// The library validates ranks, shapes and dtypes (docs/spec.md "Bad input"); this command only derives
// output shapes from input shapes, so it checks the ranks it needs for that and nothing more.
#include <cmath>
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
#include "expanse/expanse.h"
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

// ---------------------------------------------------------------- options and help

const std::vector<OptionSpec>& run_options() {
  static const std::vector<OptionSpec> specs = {
      {"inputs", true, "DIR", "directory holding the input files <name>.npy (required)"},
      {"outputs", true, "DIR", "directory for the output files <name>.npy (required; created if missing)"},
      {"backend", true, "NAME", "backend (default: $EXPANSE_BACKEND or \"reference\")"},
      {"device", true, "N", "device index on the backend (default 0)"},
      {"p", true, "P", "degree of the power (default 2; p = 1 is linear attention)"},
      {"scale", true, "S", "query scale (default 0: the library's 1/sqrt(d))"},
      {"chunk", true, "C", "chunk size: power_attention auto (default: the library picks the form and size),\n"
                           "0 (the quadratic form) or C; update_state, query_state C >= 1 (required);\n"
                           "chunk_attention C (0 or absent: one chunk)"},
      {"normalize", true, "0|1", "divide by the normalizer (default 1; needs an even p)"},
      {"layout", true, "L", "feature-map layout: sympow (default), tensor, tiled:N"},
      {"dtype", true, "T", "convert the token inputs to T (f16, bf16, f32, f64) before running"},
      {"final-state", false, "", "power_attention: also write the final state S, z"},
      {"check-finite", false, "", "refuse inputs holding NaN or infinity (log_g = -inf is a reset), naming\n"
                                  "the input and the index of its first such element"},
  };
  return specs;
}

// Options each op reads (besides inputs, outputs, backend, device, dtype).
std::vector<std::string> op_options(expanse_op_kind op) {
  switch (op) {
    case EXPANSE_OP_SYMPOW_EXPAND: return {"p", "layout"};
    case EXPANSE_OP_UPDATE_STATE: return {"p", "chunk", "layout"};
    case EXPANSE_OP_DISCUMSUM: return {};
    case EXPANSE_OP_QUERY_STATE: return {"p", "scale", "chunk", "normalize", "layout"};
    case EXPANSE_OP_CHUNK_ATTENTION: return {"p", "scale", "chunk"};
    case EXPANSE_OP_POWER_ATTENTION:
      return {"p", "scale", "chunk", "normalize", "layout", "final-state"};
    case EXPANSE_OP_POWER_ATTENTION_STEP: return {"p", "scale", "normalize", "layout"};
    default: return {};
  }
}

void print_help(const ArgParser& args) {
  std::printf(
      "usage: expanse run <op> --inputs DIR --outputs DIR [options]\n"
      "\n"
      "Reads the inputs of <op> from DIR/<name>.npy, runs the op once and writes each output to\n"
      "DIR/<name>.npy, printing one line per output (name, shape, dtype). Inputs in [brackets] are\n"
      "optional and used when their file exists. Shapes follow docs/spec.md: token tensors are\n"
      "[b,t,heads,dim], n = ceil(t / chunk), D = expanded dim of phi for p, d and the layout.\n"
      "\n"
      "operations and files:\n"
      "  sympow_expand         in:  x [...,d]\n"
      "                        out: out [...,D]\n"
      "  update_state          in:  k [b,t,h,d], v [b,t,h,e], [log_g [b,t,h]]      (needs --chunk)\n"
      "                        out: S [b,n,h,D,e], z [b,n,h,D]\n"
      "  discumsum             in:  X [b,n,h,...], A [b,n,h], [Y_init [b,h,...]]\n"
      "                        out: Y [b,n+1,h,...]\n"
      "  query_state           in:  q [b,t,hq,d], S [b,n,h,D,e], [z [b,n,h,D]], [log_g],\n"
      "                             [y [b,t,hq,e], l [b,t,hq], rowmax [b,t,hq]]  (needs --chunk)\n"
      "                        out: o [b,t,hq,e]\n"
      "  chunk_attention       in:  q, k, v, [log_g]\n"
      "                        out: y [b,t,hq,e], l [b,t,hq], rowmax [b,t,hq]\n"
      "  power_attention       in:  q [b,t,hq,d], k [b,t,h,d], v [b,t,h,e], [log_g],\n"
      "                             [S0 [b,h,D,e], z0 [b,h,D]]\n"
      "                        out: o [b,t,hq,e]; with --final-state also S [b,h,D,e], z [b,h,D]\n"
      "  power_attention_step  in:  q [b,hq,d] or [b,1,hq,d], k [b,h,d], v [b,h,e], [log_g [b,h]],\n"
      "                             S [b,h,D,e], [z [b,h,D]]\n"
      "                        out: o [b,hq,e] or [b,1,hq,e], and the updated S, z\n"
      "\n"
      "dtypes: inputs are .npy float16/float32/float64 arrays (C order). By default they are used in\n"
      "their file dtype. --dtype T converts the token inputs (x, q, k, v, and X of discumsum) to T;\n"
      "gates and states (log_g, A, S, z, S0, z0, Y_init, y, l, rowmax) are used as read when\n"
      "float32/float64 and converted to float32 otherwise. The main output (out, o) has the dtype of\n"
      "x, q (query_state) or v. The states and accumulators (S, z, Y, y, l, rowmax) are written in\n"
      "f32 for f16, bf16 and f32 token inputs and in f64 for f64 inputs, on every backend (as the\n"
      "Python package returns them); the updated S, z of power_attention_step keep their input\n"
      "dtype. numpy has no bfloat16: bf16 outputs are written as float32 files\n"
      "(exactly). Outputs are filled with NaN before the run, so an element a backend does not\n"
      "write shows up as NaN.\n"
      "\n"
      "options:\n%s"
      "\n"
      "example:\n"
      "  expanse run power_attention --inputs in --outputs out --p 2 --final-state\n"
      "  expanse run power_attention --inputs in --outputs out --p 2 --chunk 64 --check-finite\n",
      args.options_help().c_str());
}

// ---------------------------------------------------------------- the run

struct Settings {
  expanse_op_kind op;
  std::string op_name;
  fs::path in_dir, out_dir;
  int32_t device = 0;
  int32_t p = 2;
  double scale = 0.0;
  int64_t chunk = 0;  // EXPANSE_CHUNK_AUTO for power_attention unless --chunk says otherwise
  bool has_chunk = false;
  bool normalize = true;
  expanse_layout layout{};
  bool has_dtype = false;
  expanse_dtype dtype = EXPANSE_F32;
  bool final_state = false;
  bool check_finite = false;
};

// The dtype of the states and accumulators an op writes: f64 for f64 token inputs, f32 otherwise,
// whatever the backend (one meaning per dtype, as in the Python package).
expanse_dtype state_dtype(const NpyArray* token) { return token->dtype == EXPANSE_F64 ? EXPANSE_F64 : EXPANSE_F32; }

// Holds the host arrays (inputs and outputs) of one run; addresses are stable.
class Arrays {
 public:
  explicit Arrays(const Settings& s) : s_(s) {}

  // DIR/<name>.npy, or nullptr when it does not exist and is optional.
  NpyArray* load(const std::string& name, bool required) {
    const fs::path file = s_.in_dir / (name + ".npy");
    std::error_code ec;
    if (fs::status(file, ec).type() == fs::file_type::not_found) {
      if (!required) return nullptr;
      throw std::runtime_error(s_.op_name + " needs the input file " + file.string() +
                               ", which does not exist");
    }
    // Anything else that is wrong with the path (a FIFO, a symbolic link loop) npy_read reports.
    auto a = std::make_unique<NpyArray>(npy_read(file.string()));
    files_.emplace_back(a.get(), file.string());
    arrays_.push_back(std::move(a));
    return arrays_.back().get();
  }
  // A token input (x, q, k, v, X): converted to --dtype when given.
  NpyArray* token(const std::string& name, bool required = true) {
    NpyArray* a = load(name, required);
    if (a && s_.has_dtype && a->dtype != s_.dtype) *a = convert_array(*a, s_.dtype);
    return a;
  }
  // A gate or state input: used as read when f32/f64, else converted to f32.
  NpyArray* aux(const std::string& name, bool required = false) {
    NpyArray* a = load(name, required);
    if (a && a->dtype != EXPANSE_F32 && a->dtype != EXPANSE_F64) *a = convert_array(*a, EXPANSE_F32);
    return a;
  }

  // Throws unless `a` has one of the ranks; `expect` describes the layout, e.g. "[b,t,h,d]".
  void need_rank(const NpyArray* a, std::initializer_list<size_t> ranks, const std::string& name,
                 const std::string& expect) const {
    for (size_t r : ranks)
      if (a->shape.size() == r) return;
    std::string want;
    for (size_t r : ranks) want += (want.empty() ? "" : " or ") + std::to_string(r);
    rank_error(a, name, want, expect);
  }
  // Throws unless `a` has rank >= min_rank.
  void need_min_rank(const NpyArray* a, size_t min_rank, const std::string& name,
                     const std::string& expect) const {
    if (a->shape.size() < min_rank) rank_error(a, name, std::to_string(min_rank) + " or more", expect);
  }

  // A new output array, zero-filled (the Binder poisons it).
  NpyArray* output(const std::string& name, std::vector<int64_t> shape, expanse_dtype dtype) {
    auto a = std::make_unique<NpyArray>();
    a->dtype = dtype;
    a->shape = std::move(shape);
    const int64_t n = checked_numel(a->shape, "output " + name + " of shape " +
                                                  shape_to_string(a->shape), dtype_bytes(dtype));
    const size_t bytes = static_cast<size_t>(n) * dtype_bytes(dtype);
    try {
      a->data.resize(bytes);
    } catch (const std::bad_alloc&) {
      throw std::runtime_error("output " + name + " of shape " + shape_to_string(a->shape) +
                               " needs " + std::to_string(bytes) +
                               " bytes of host memory, which could not be allocated");
    }
    outputs_.emplace_back(name, a.get());
    arrays_.push_back(std::move(a));
    return arrays_.back().get();
  }
  // An in-out array written back under `name`.
  void also_output(const std::string& name, NpyArray* a) {
    if (a) outputs_.emplace_back(name, a);
  }

  const std::vector<std::pair<std::string, NpyArray*>>& outputs() const { return outputs_; }

 private:
  [[noreturn]] void rank_error(const NpyArray* a, const std::string& name, const std::string& want,
                               const std::string& expect) const {
    throw std::runtime_error("file " + file_of(a) + " has shape " + shape_to_string(a->shape) +
                             " (rank " + std::to_string(a->shape.size()) + "), but " + s_.op_name +
                             " expects " + name + " of rank " + want + ": " + expect);
  }
  std::string file_of(const NpyArray* a) const {
    for (const auto& f : files_)
      if (f.first == a) return f.second;
    return "?";
  }

  const Settings& s_;
  std::vector<std::unique_ptr<NpyArray>> arrays_;
  std::vector<std::pair<const NpyArray*, std::string>> files_;
  std::vector<std::pair<std::string, NpyArray*>> outputs_;
};

int64_t expanded_dim(const Settings& s, int64_t d) {
  int64_t D = 0;
  check_status(expanse_expanded_dim(s.p, d, s.layout, &D), "expanse_expanded_dim");
  if (D < 0) throw std::runtime_error("expanse_expanded_dim returned a negative dimension");
  return D;
}

int64_t chunk_count(int64_t t, int64_t c) { return t / c + (t % c != 0 ? 1 : 0); }

void require_chunk(const Settings& s) {
  if (!s.has_chunk || s.chunk < 1)
    throw UsageError(s.op_name + " needs --chunk C with C >= 1");
}

// Runs `op` with `args`: support check, workspace, run, copy back, synchronize.
void execute(const Settings& s, expanse_context* ctx, Binder& bind, const void* args) {
  char reason[1024] = {0};
  const expanse_status sup = expanse_supports(ctx, s.op, args, reason, sizeof reason);
  if (sup == EXPANSE_ERROR_UNSUPPORTED) {
    // The library's reason already names the op and the backend.
    std::string why = reason[0] ? std::string(reason) : std::string(expanse_last_error());
    if (why.empty()) {
      const char* backend = expanse_context_backend(ctx);
      why = "backend " + std::string(backend ? backend : "?") + " does not support this " +
            s.op_name + " problem";
    }
    throw LibraryError(sup, why);
  }
  check_status(sup, "expanse_supports");
  size_t ws_bytes = 0;
  check_status(expanse_workspace_size(ctx, s.op, args, &ws_bytes), "expanse_workspace_size");
  DeviceBuffer workspace(ctx, ws_bytes);
  // Detach the workspace from the context before it is freed, however this function is left.
  struct Detach {
    expanse_context* ctx;
    bool set = false;
    ~Detach() {
      if (set) (void)expanse_context_set_workspace(ctx, nullptr, 0);
    }
  } detach{ctx};
  if (ws_bytes > 0) {
    check_status(expanse_context_set_workspace(ctx, workspace.get(), ws_bytes),
                 "expanse_context_set_workspace");
    detach.set = true;
  }
  check_status(expanse_run(ctx, s.op, args), "expanse_run");
  bind.copy_back();
  check_status(expanse_synchronize(ctx), "expanse_synchronize");
}

void run_op(const Settings& s, expanse_context* ctx, Binder& bind, Arrays& io) {
  switch (s.op) {
    case EXPANSE_OP_SYMPOW_EXPAND: {
      NpyArray* x = io.token("x");
      io.need_min_rank(x, 1, "x", "[..., d]");
      std::vector<int64_t> shape = x->shape;
      shape.back() = expanded_dim(s, x->shape.back());
      NpyArray* out = io.output("out", shape, x->dtype);
      expanse_sympow_expand_args a;
      expanse_sympow_expand_args_init(&a);
      a.x = bind.input(x);
      a.out = bind.output(out);
      a.p = s.p;
      a.layout = s.layout;
      execute(s, ctx, bind, &a);
      return;
    }
    case EXPANSE_OP_UPDATE_STATE: {
      require_chunk(s);
      NpyArray* k = io.token("k");
      NpyArray* v = io.token("v");
      NpyArray* log_g = io.aux("log_g");
      io.need_rank(k, {4}, "k", "[b,t,h,d]");
      io.need_rank(v, {4}, "v", "[b,t,h,e]");
      const int64_t b = k->shape[0], t = k->shape[1], h = k->shape[2], d = k->shape[3];
      const int64_t e = v->shape[3], n = chunk_count(t, s.chunk), D = expanded_dim(s, d);
      NpyArray* S = io.output("S", {b, n, h, D, e}, state_dtype(k));
      NpyArray* z = io.output("z", {b, n, h, D}, state_dtype(k));
      expanse_update_state_args a;
      expanse_update_state_args_init(&a);
      a.k = bind.input(k);
      a.v = bind.input(v);
      a.log_g = bind.input(log_g);
      a.S = bind.output(S);
      a.z = bind.output(z);
      a.p = s.p;
      a.chunk_size = s.chunk;
      a.layout = s.layout;
      execute(s, ctx, bind, &a);
      return;
    }
    case EXPANSE_OP_DISCUMSUM: {
      NpyArray* X = io.token("X");
      NpyArray* A = io.aux("A", /*required=*/true);
      NpyArray* Y_init = io.aux("Y_init");
      io.need_min_rank(X, 3, "X", "[b,n,h,...]");
      std::vector<int64_t> shape = X->shape;
      if (shape[1] == INT64_MAX) throw std::runtime_error("X has too many chunks");
      shape[1] += 1;
      NpyArray* Y = io.output("Y", shape, state_dtype(X));
      expanse_discumsum_args a;
      expanse_discumsum_args_init(&a);
      a.X = bind.input(X);
      a.A = bind.input(A);
      a.Y_init = bind.input(Y_init);
      a.Y = bind.output(Y);
      execute(s, ctx, bind, &a);
      return;
    }
    case EXPANSE_OP_QUERY_STATE: {
      require_chunk(s);
      NpyArray* q = io.token("q");
      NpyArray* S = io.aux("S", /*required=*/true);
      NpyArray* z = io.aux("z");
      NpyArray* log_g = io.aux("log_g");
      NpyArray* y = io.aux("y");
      NpyArray* l = io.aux("l");
      NpyArray* rowmax = io.aux("rowmax");
      io.need_rank(q, {4}, "q", "[b,t,hq,d]");
      io.need_rank(S, {5}, "S", "[b,n,h,D,e]");
      const int64_t e = S->shape[4];
      NpyArray* o = io.output("o", {q->shape[0], q->shape[1], q->shape[2], e}, q->dtype);
      expanse_query_state_args a;
      expanse_query_state_args_init(&a);
      a.q = bind.input(q);
      a.S = bind.input(S);
      a.z = bind.input(z);
      a.log_g = bind.input(log_g);
      a.y = bind.input(y);
      a.l = bind.input(l);
      a.rowmax = bind.input(rowmax);
      a.o = bind.output(o);
      a.p = s.p;
      a.scale = s.scale;
      a.chunk_size = s.chunk;
      a.normalize = s.normalize ? 1 : 0;
      a.layout = s.layout;
      execute(s, ctx, bind, &a);
      return;
    }
    case EXPANSE_OP_CHUNK_ATTENTION: {
      NpyArray* q = io.token("q");
      NpyArray* k = io.token("k");
      NpyArray* v = io.token("v");
      NpyArray* log_g = io.aux("log_g");
      io.need_rank(q, {4}, "q", "[b,t,hq,d]");
      io.need_rank(v, {4}, "v", "[b,t,h,e]");
      const int64_t b = q->shape[0], t = q->shape[1], hq = q->shape[2], e = v->shape[3];
      NpyArray* y = io.output("y", {b, t, hq, e}, state_dtype(q));
      NpyArray* l = io.output("l", {b, t, hq}, state_dtype(q));
      NpyArray* rowmax = io.output("rowmax", {b, t, hq}, state_dtype(q));
      expanse_chunk_attention_args a;
      expanse_chunk_attention_args_init(&a);
      a.q = bind.input(q);
      a.k = bind.input(k);
      a.v = bind.input(v);
      a.log_g = bind.input(log_g);
      a.y = bind.output(y);
      a.l = bind.output(l);
      a.rowmax = bind.output(rowmax);
      a.p = s.p;
      a.scale = s.scale;
      a.chunk_size = s.chunk;
      execute(s, ctx, bind, &a);
      return;
    }
    case EXPANSE_OP_POWER_ATTENTION: {
      NpyArray* q = io.token("q");
      NpyArray* k = io.token("k");
      NpyArray* v = io.token("v");
      NpyArray* log_g = io.aux("log_g");
      NpyArray* S0 = io.aux("S0");
      NpyArray* z0 = io.aux("z0");
      io.need_rank(q, {4}, "q", "[b,t,hq,d]");
      io.need_rank(v, {4}, "v", "[b,t,h,e]");
      const int64_t b = q->shape[0], t = q->shape[1], hq = q->shape[2], e = v->shape[3];
      NpyArray* o = io.output("o", {b, t, hq, e}, v->dtype);
      NpyArray* S = nullptr;
      NpyArray* z = nullptr;
      if (s.final_state) {
        io.need_rank(k, {4}, "k", "[b,t,h,d]");
        const int64_t h = k->shape[2], D = expanded_dim(s, k->shape[3]);
        S = io.output("S", {b, h, D, e}, state_dtype(q));
        z = io.output("z", {b, h, D}, state_dtype(q));
      }
      expanse_power_attention_args a;
      expanse_power_attention_args_init(&a);
      a.q = bind.input(q);
      a.k = bind.input(k);
      a.v = bind.input(v);
      a.log_g = bind.input(log_g);
      a.initial_S = bind.input(S0);
      a.initial_z = bind.input(z0);
      a.o = bind.output(o);
      a.final_S = bind.output(S);
      a.final_z = bind.output(z);
      a.p = s.p;
      a.scale = s.scale;
      a.chunk_size = s.chunk;
      a.normalize = s.normalize ? 1 : 0;
      a.layout = s.layout;
      execute(s, ctx, bind, &a);
      return;
    }
    case EXPANSE_OP_POWER_ATTENTION_STEP: {
      NpyArray* q = io.token("q");
      NpyArray* k = io.token("k");
      NpyArray* v = io.token("v");
      NpyArray* log_g = io.aux("log_g");
      NpyArray* S = io.aux("S", /*required=*/true);
      NpyArray* z = io.aux("z");
      io.need_rank(q, {3, 4}, "q", "[b,hq,d] or [b,1,hq,d]");
      io.need_rank(v, {3, 4}, "v", "[b,h,e]");
      std::vector<int64_t> o_shape = q->shape;
      o_shape.back() = v->shape.back();
      NpyArray* o = io.output("o", o_shape, v->dtype);
      io.also_output("S", S);
      io.also_output("z", z);
      expanse_power_attention_step_args a;
      expanse_power_attention_step_args_init(&a);
      a.q = bind.input(q);
      a.k = bind.input(k);
      a.v = bind.input(v);
      a.log_g = bind.input(log_g);
      a.S = bind.inout(S);
      a.z = bind.inout(z);
      a.o = bind.output(o);
      a.p = s.p;
      a.scale = s.scale;
      a.normalize = s.normalize ? 1 : 0;
      a.layout = s.layout;
      execute(s, ctx, bind, &a);
      return;
    }
    default: break;
  }
  throw std::runtime_error("operation " + s.op_name + " is not handled by expanse run");
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
  if (!args.has("inputs")) throw UsageError("expanse run needs --inputs DIR");
  if (!args.has("outputs")) throw UsageError("expanse run needs --outputs DIR");
  s.in_dir = args.get_string("inputs", "");
  s.out_dir = args.get_string("outputs", "");
  if (s.in_dir.empty()) throw UsageError("--inputs needs a directory name");
  if (s.out_dir.empty()) throw UsageError("--outputs needs a directory name");
  s.device = static_cast<int32_t>(args.get_int("device", 0, 0, INT32_MAX));
  s.p = static_cast<int32_t>(args.get_int("p", 2, 1, INT32_MAX));
  s.scale = args.get_double("scale", 0.0);
  const bool attention = s.op == EXPANSE_OP_POWER_ATTENTION;
  s.has_chunk = args.has("chunk");
  s.chunk = s.has_chunk ? parse_chunk(*args.value("chunk"), "--chunk", /*allow_auto=*/attention)
                        : attention ? EXPANSE_CHUNK_AUTO : 0;
  s.normalize = args.has("normalize") ? parse_bool(*args.value("normalize"), "--normalize") : true;
  s.layout = parse_layout(args.get_string("layout", "sympow"), "--layout");
  s.has_dtype = args.has("dtype");
  if (s.has_dtype) s.dtype = parse_dtype(*args.value("dtype"), "--dtype");
  s.final_state = args.get_flag("final-state");
  s.check_finite = args.get_flag("check-finite");

  // Options the op does not read are most likely a mistake: say so, but run.
  const std::vector<std::string> used = op_options(s.op);
  for (const auto& name : args.given()) {
    if (name == "inputs" || name == "outputs" || name == "backend" || name == "device" ||
        name == "dtype" || name == "check-finite")
      continue;
    bool ok = false;
    for (const auto& u : used) ok = ok || (u == name);
    if (!ok)
      std::fprintf(stderr, "expanse: warning: --%s is not used by %s\n", name.c_str(),
                   s.op_name.c_str());
  }

  check_input_dir(s.in_dir);

  const char* def_backend = expanse_default_backend();
  const std::string backend = args.get_string("backend", def_backend ? def_backend : "reference");
  Context ctx(backend, s.device);
  const int32_t device_type = expanse_context_device_type(ctx.get());
  if (s.check_finite)
    check_status(expanse_context_set_check_finite(ctx.get(), 1), "expanse_context_set_check_finite");

  Arrays io(s);
  {
    Binder bind(ctx.get(), device_type != EXPANSE_DEVICE_CPU, device_type, s.device);
    run_op(s, ctx.get(), bind, io);
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
