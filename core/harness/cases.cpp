// Random inputs, runs on any backend, and comparison with an oracle (see cases.hpp).
#include "cases.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <limits>
#include <sstream>

#include "naive_oracle.hpp"

namespace expanse::harness {
namespace {

int64_t chunk_count(const op_config& cfg) {
  return harness::chunk_count(cfg.t, cfg.c > 0 ? cfg.c : std::max<int64_t>(cfg.t, 1));
}

// States and log_g are f32 on every backend, f64 when the whole problem is f64 (the oracle).
expanse_dtype state_dtype(const op_config& cfg) { return cfg.dtype == EXPANSE_F64 ? EXPANSE_F64 : EXPANSE_F32; }

host_tensor normal_tensor(expanse_dtype dtype, std::vector<int64_t> shape, std::mt19937_64& rng, double sigma = 1.0) {
  host_tensor t = host_tensor::zeros(dtype, std::move(shape));
  std::normal_distribution<double> dist(0.0, sigma);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

// log_g = logsigmoid(noise): the gating of docs/performance.md's configurations (all decays < 1).
// With `resets`, about one gate in six is exactly 0 (log_g = -inf): a reset. With `growing`, log_g is
// shifted up by 0.3, so that about a third of the gates are above 1 (their sum still falls, by about
// 0.1 a token, as the decays between them outweigh them).
host_tensor log_gate_tensor(expanse_dtype dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                            bool resets = false, bool growing = false) {
  host_tensor t = host_tensor::zeros(dtype, std::move(shape));
  std::normal_distribution<double> dist(1.0, 1.0);
  std::uniform_int_distribution<int> die(0, 5);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = dist(rng);
    const bool reset = resets && die(rng) == 0;
    t.set(i, reset ? -std::numeric_limits<double>::infinity() : -std::log1p(std::exp(-x)) + (growing ? 0.3 : 0.0));
  }
  return t;
}

}  // namespace

host_tensor cast(const host_tensor& src, expanse_dtype dtype) {
  host_tensor t = host_tensor::zeros(dtype, src.shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, src.get(i));
  return t;
}

namespace {

// A state (S [b,h,D,e], z [b,h,D]) as left by a short random gated sequence: realistic magnitudes
// and, for even p, a positive denominator phi(q)^T z.
void random_state(const op_config& cfg, std::mt19937_64& rng, host_tensor& S, host_tensor& z) {
  op_config prefix = cfg;
  prefix.op = expanse::ops::power_attention;
  prefix.t = 7;
  prefix.hq = cfg.h;
  prefix.initial_state = false;
  prefix.final_state = true;
  prefix.normalize = true;  // so that the oracle also produces z
  tensor_map in;
  in["q"] = normal_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h, cfg.d}, rng);
  in["k"] = normal_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h, cfg.d}, rng);
  in["v"] = normal_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h, cfg.e}, rng);
  if (cfg.gated) in["log_g"] = log_gate_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h}, rng, cfg.resets, cfg.growing);
  prefix.gated = cfg.gated;
  tensor_map out = naive::run(prefix, in);
  S = cast(out.at("final_S"), state_dtype(cfg));
  z = cast(out.at("final_z"), state_dtype(cfg));
}

// The config's parameters into an op's args struct, by the names of the library's table: p, scale,
// chunk_size (cfg.c), normalize and layout, where the op has them.
void fill_params(const op_config& cfg, const std::vector<expanse_param_info>& params, void* args) {
  for (const expanse_param_info& p : params) {
    char* at = static_cast<char*>(args) + p.offset;
    const std::string name = p.name;
    if (name == "p") std::memcpy(at, &cfg.p, sizeof(cfg.p));
    else if (name == "scale") std::memcpy(at, &cfg.scale, sizeof(cfg.scale));
    else if (name == "chunk_size") std::memcpy(at, &cfg.c, sizeof(cfg.c));
    else if (name == "layout") std::memcpy(at, &cfg.layout, sizeof(cfg.layout));
    else if (name == "normalize") {
      const int32_t v = cfg.normalize ? 1 : 0;
      std::memcpy(at, &v, sizeof(v));
    } else {
      throw std::logic_error("harness: no config field for parameter " + name);
    }
  }
}

}  // namespace

std::string op_config::label() const {
  std::ostringstream s;
  s << expanse_op_name(op) << " --b " << b << " --t " << t << " --hq " << hq << " --h " << h << " --d " << d
    << " --e " << e << " --p " << p << " --chunk "
    << (c == EXPANSE_CHUNK_AUTO ? std::string("auto") : std::to_string(c)) << " --layout "
    << (layout.kind == EXPANSE_LAYOUT_TILED ? "tiled:" + std::to_string(layout.d_tile)
                                            : layout.kind == EXPANSE_LAYOUT_TENSOR ? "tensor" : "sympow")
    << " --dtype " << expanse_dtype_name(dtype) << " --gated " << gated << " --normalize " << normalize
    << " --initial-state " << initial_state << " --final-state " << final_state << " --intra " << intra;
  if (resets) s << " --resets 1";
  if (growing) s << " --growing 1";
  if (scale != 0.0) s << " --scale " << scale;
  return s.str();
}

namespace {

// The library's tables of an operation.
struct op_tables {
  std::vector<expanse_tensor_arg_info> tensors;
  std::vector<expanse_param_info> params;
};

op_tables tables_of(expanse_op_kind op) { return {expanse::tensor_args(op), expanse::params(op)}; }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// A gradient or cotangent of a backward operation (no forward tensor's name starts with 'd').
bool is_gradient(const expanse_tensor_arg_info& t) { return t.name[0] == 'd'; }

// The forward operation of a backward one (itself for a forward).
expanse_op_kind forward_of(expanse_op_kind op) {
  const std::string name = expanse_op_name(op);
  const size_t at = name.rfind("_backward");
  if (at == std::string::npos) return op;
  expanse_op_kind forward;
  expanse::check(expanse_op_from_name(name.substr(0, at).c_str(), &forward));
  return forward;
}

// Whether a config gives tensor t: required ones always; log_g when gated; initial states (and
// discumsum's Y_init) with initial_state, final states with final_state; the intra-chunk inputs
// with intra; a normalizer (z, *_z) given as an input, initial or final state also needs normalize;
// other optional outputs always.
// A backward's gradients and cotangents (the names that start with 'd': no forward tensor's does) go
// with the forward tensor they belong to (dlog_g with log_g, dfinal_S with final_S, dout with o); its
// input o, the forward's output, with normalize.
bool gives(const op_config& cfg, const expanse_tensor_arg_info& t) {
  if (t.required) return true;
  const std::string name = t.name;
  if (name == "o" && t.role == EXPANSE_ARG_INPUT) return cfg.normalize;
  if (name[0] == 'd') {
    const std::string of = name == "dout" ? "o" : name.substr(1);
    op_config forward = cfg;
    forward.op = forward_of(cfg.op);
    for (const expanse_tensor_arg_info& f : expanse::tensor_args(forward.op))
      if (of == f.name) return gives(forward, f);
    throw std::logic_error("harness: " + name + " belongs to no tensor of the forward");
  }
  const bool normalizer = name == "z" || (name.size() > 2 && name.compare(name.size() - 2, 2, "_z") == 0);
  if (name == "log_g") return cfg.gated;
  if (starts_with(name, "initial_") || name == "Y_init") return cfg.initial_state && (!normalizer || cfg.normalize);
  if (starts_with(name, "final_")) return cfg.final_state && (!normalizer || cfg.normalize);
  if (t.role == EXPANSE_ARG_OUTPUT) return true;  // update_state's z
  if (normalizer) return cfg.normalize;
  return cfg.intra;  // query_state's y, l, rowmax
}

std::vector<std::string> words(const char* dims) {
  std::vector<std::string> w;
  std::istringstream in(dims);
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

// A tensor's shape for a config by its shape rule. "..." stands for [t] where the rule leads with it
// (sympow_expand's rows) and for [d, e] where it trails (discumsum's trailing dims); the token axis
// "t?" of a decoding step is omitted for one token, as callers may.
std::vector<int64_t> shape_for(const op_config& cfg, const char* dims) {
  const std::vector<std::string> w = words(dims);
  std::vector<int64_t> shape;
  for (size_t i = 0; i < w.size(); ++i) {
    const std::string& x = w[i];
    if (x == "...") {
      if (i == 0) shape.push_back(cfg.t);
      else shape.insert(shape.end(), {cfg.d, cfg.e});
    } else if (x == "t?") {
      if (cfg.t != 1) shape.push_back(cfg.t);
    } else if (x == "D") {
      shape.push_back(expanse::expanded_dim(cfg.p, cfg.d, cfg.layout));
    } else if (x == "n" || x == "n+1") {
      shape.push_back(chunk_count(cfg) + (x == "n+1"));
    } else {
      const std::map<std::string, int64_t> sizes = {{"b", cfg.b}, {"t", cfg.t}, {"hq", cfg.hq},
                                                    {"h", cfg.h}, {"d", cfg.d}, {"e", cfg.e}};
      shape.push_back(sizes.at(x));
    }
  }
  return shape;
}

// A tensor's dtype in a config by its dtype rule: token tensors in cfg.dtype, gates and states f32
// (f64 when the whole problem is f64), "=NAME" as NAME.
expanse_dtype dtype_for(const op_config& cfg, const op_tables& op, const expanse_tensor_arg_info& t) {
  const std::string rule = t.dtypes;
  if (rule == "float") return cfg.dtype;
  if (rule == "f32|f64") return state_dtype(cfg);
  const std::string other = rule.substr(1, rule.find('|') == std::string::npos ? std::string::npos : rule.find('|') - 1);
  for (const auto& o : op.tensors)
    if (other == o.name) return dtype_for(cfg, op, o);
  throw std::logic_error("harness: dtype rule " + rule + " names no tensor");
}

// A state [b,h,D,e] or normalizer [b,h,D] entering a sequence (power_attention's initial state, a
// decoding step's state); a backward's cotangent of a state is plain noise.
bool is_entering_state(const expanse_tensor_arg_info& t) {
  const std::string dims = t.dims;
  return (dims == "b h D e" || dims == "b h D") && !is_gradient(t);
}
// Chunk states [b,n,h,D,e] / [b,n,h,D] as inputs (query_state's S, z; not a cotangent's dS).
bool is_chunk_state(const expanse_tensor_arg_info& t) {
  const std::string dims = t.dims;
  return t.role == EXPANSE_ARG_INPUT && (dims == "b n h D e" || dims == "b n h D") && !is_gradient(t);
}
bool is_gate(const expanse_tensor_arg_info& t) { return std::string(t.name) == "log_g" || std::string(t.name) == "A"; }

// query_state's consistent inputs: the states entering each chunk and the intra-chunk result of one
// random sequence (k, v drawn here), computed by the naive oracle.
void consistent_query_inputs(const op_config& cfg, std::mt19937_64& rng, tensor_map& in) {
  const expanse_dtype dt = cfg.dtype, st = state_dtype(cfg);
  const int64_t n = chunk_count(cfg), D = expanse::expanded_dim(cfg.p, cfg.d, cfg.layout);
  in["k"] = normal_tensor(dt, {cfg.b, cfg.t, cfg.h, cfg.d}, rng);
  in["v"] = normal_tensor(dt, {cfg.b, cfg.t, cfg.h, cfg.e}, rng);
  op_config u = cfg;
  u.op = expanse::ops::update_state;
  tensor_map local = naive::run(u, in);
  // discumsum over [b,n,h,D,e] and [b,n,h,D]: A_m is the chunk's total log-gate.
  host_tensor A = host_tensor::zeros(EXPANSE_F64, {cfg.b, n, cfg.h});
  for (int64_t bi = 0; bi < cfg.b; ++bi)
    for (int64_t hi = 0; hi < cfg.h; ++hi)
      for (int64_t m = 0; m < n; ++m) {
        double sum = 0;
        for (int64_t j = m * cfg.c; j < std::min(cfg.t, (m + 1) * cfg.c); ++j)
          if (cfg.gated) sum += in["log_g"].get((bi * cfg.t + j) * cfg.h + hi);
        A.set((bi * n + m) * cfg.h + hi, sum);
      }
  auto entering = [&](const host_tensor& X, int64_t inner) {  // Y[:, :n] of discumsum, naive
    std::vector<int64_t> shape = {cfg.b, n, cfg.h, D};
    if (inner > 1) shape.push_back(inner);
    host_tensor Y = host_tensor::zeros(st, shape);
    const int64_t row = D * inner;
    for (int64_t bi = 0; bi < cfg.b; ++bi)
      for (int64_t hi = 0; hi < cfg.h; ++hi) {
        std::vector<double> acc(static_cast<size_t>(row), 0.0);
        for (int64_t m = 0; m < n; ++m) {
          const int64_t base = ((bi * n + m) * cfg.h + hi) * row;
          for (int64_t i = 0; i < row; ++i) Y.set(base + i, acc[size_t(i)]);
          const double g = std::exp(A.get((bi * n + m) * cfg.h + hi));
          for (int64_t i = 0; i < row; ++i) acc[size_t(i)] = g * acc[size_t(i)] + X.get(base + i);
        }
      }
    return Y;
  };
  in["S"] = entering(local.at("S"), cfg.e);
  if (cfg.normalize) in["z"] = entering(local.at("z"), 1);
  if (cfg.intra) {
    op_config ca = cfg;
    ca.op = expanse::ops::chunk_attention;
    tensor_map intra = naive::run(ca, in);
    for (const char* name : {"y", "l", "rowmax"}) in[name] = cast(intra.at(name), st);
  }
  in.erase("k");
  in.erase("v");
}

}  // namespace

tensor_map make_inputs(const op_config& cfg, uint64_t seed, bool consistent, const forward_runner& forward) {
  std::mt19937_64 rng(seed);
  const op_tables op = tables_of(cfg.op);
  tensor_map in;
  bool chunk_states = false, entering_state = false;
  for (const auto& [name, spec] : input_specs(cfg)) {
    const expanse_tensor_arg_info* t = nullptr;
    for (const auto& o : op.tensors)
      if (name == o.name) t = &o;
    if (is_gate(*t)) in[name] = log_gate_tensor(spec.dtype, spec.shape, rng, cfg.resets, cfg.growing);
    else in[name] = normal_tensor(spec.dtype, spec.shape, rng);
    chunk_states = chunk_states || is_chunk_state(*t);
    entering_state = entering_state || is_entering_state(*t);
  }
  // Realistic states: from a short random sequence (so that, for even p, phi(q)^T z > 0).
  if (entering_state) {
    host_tensor S, z;
    random_state(cfg, rng, S, z);
    for (const auto& t : op.tensors)
      if (is_entering_state(t) && in.count(t.name)) in[t.name] = std::string(t.dims) == "b h D e" ? S : z;
  }
  if (chunk_states && consistent) consistent_query_inputs(cfg, rng, in);
  // A backward's o is its forward's output on these inputs (as a caller saves it).
  if (in.count("o")) {
    op_config f = cfg;
    f.op = forward_of(cfg.op);
    f.final_state = false;
    in["o"] = cast((forward ? forward(f, in) : naive::run(f, in)).at("o"), in["o"].dtype);
  }
  return in;
}

spec_map input_specs(const op_config& cfg) {
  const op_tables op = tables_of(cfg.op);
  spec_map in;
  for (const auto& t : op.tensors)
    if (t.role != EXPANSE_ARG_OUTPUT && gives(cfg, t)) in[t.name] = {dtype_for(cfg, op, t), shape_for(cfg, t.dims)};
  return in;
}

spec_map output_specs(const op_config& cfg, bool oracle) {
  // The shapes (and native dtypes) are the library's: expanse_output_shape on views of the inputs
  // at distinct addresses that hold nothing (it reads no data).
  const op_tables op = tables_of(cfg.op);
  const spec_map inputs = input_specs(cfg);
  std::vector<unsigned char> args(expanse_op_args_size(cfg.op) + 16);
  void* a = args.data() + (16 - reinterpret_cast<uintptr_t>(args.data()) % 16) % 16;
  expanse::check(expanse_op_args_init(cfg.op, a));
  fill_params(cfg, op.params, a);
  std::map<std::string, expanse_tensor> views;
  uintptr_t next = uintptr_t(1) << 20;
  for (const auto& t : op.tensors) {
    auto it = inputs.find(t.name);
    if (t.role != EXPANSE_ARG_INPUT || it == inputs.end()) continue;
    views[t.name] = expanse::tensor_of(reinterpret_cast<void*>(next), it->second.dtype, it->second.shape, EXPANSE_DEVICE_CPU);
    next += 4096;
    const expanse_tensor* view = &views[t.name];
    std::memcpy(static_cast<char*>(a) + t.offset, &view, sizeof(view));
  }
  spec_map out;
  for (int32_t i = 0; i < int32_t(op.tensors.size()); ++i) {
    const expanse_tensor_arg_info& t = op.tensors[size_t(i)];
    if (t.role == EXPANSE_ARG_INPUT || !gives(cfg, t)) continue;
    int32_t ndim = 0, dtype = 0;
    int64_t shape[EXPANSE_MAX_DIMS] = {};
    expanse::check(expanse_output_shape(cfg.op, a, i, &ndim, shape, &dtype));
    out[t.name] = {oracle ? EXPANSE_F64 : static_cast<expanse_dtype>(dtype), {shape, shape + ndim}};
  }
  return out;
}

tensor_map make_outputs(const op_config& cfg, bool oracle) {
  tensor_map out;
  for (const auto& [name, spec] : output_specs(cfg, oracle)) out[name] = host_tensor::zeros(spec.dtype, spec.shape);
  return out;
}

prepared_run::prepared_run(expanse::context& ctx, const op_config& cfg, const tensor_map& inputs, bool oracle)
    : ctx_(ctx), cfg_(cfg), outputs_(make_outputs(cfg, oracle)) {
  const auto device = ctx.device_type();
  auto upload = [&](const std::string& name, const host_tensor& h) {
    expanse::device_buffer buf = ctx.allocate(std::max<size_t>(h.bytes.size(), 1));
    ctx.copy(buf.data(), h.bytes.data(), h.bytes.size(), EXPANSE_COPY_HOST_TO_DEVICE);
    views_[name] = expanse::tensor_of(buf.data(), h.dtype, h.shape, device, ctx.device());
    buffers_[name] = std::move(buf);
  };
  for (const auto& [name, h] : inputs) upload("in:" + name, h);
  for (const auto& [name, h] : outputs_) {
    auto it = inputs.find(name);
    host_tensor initial = h;
    if (it != inputs.end()) {
      initial = cast(it->second, h.dtype);  // the state is updated in place: start from the input state
    } else {
      for (int64_t i = 0; i < h.numel(); ++i) initial.set(i, std::numeric_limits<double>::quiet_NaN());  // poison
    }
    upload("out:" + name, initial);
  }
  ctx.synchronize();  // the host copies above must not be read after this constructor returns
}

prepared_run::prepared_run(expanse::context& ctx, const op_config& cfg, views_only) : ctx_(ctx), cfg_(cfg) {
  // Each tensor gets its own 256-aligned range; addresses only (validation reads no data), and the
  // sizes saturate instead of wrapping, so overlapping ranges never hide behind an overflow.
  uint64_t next = uint64_t(1) << 20;
  auto place = [&](const std::string& name, const tensor_spec& spec) {
    views_[name] = expanse::tensor_of(reinterpret_cast<void*>(static_cast<uintptr_t>(next)), spec.dtype, spec.shape,
                                      ctx.device_type(), ctx.device());
    unsigned __int128 bytes = expanse_dtype_size(spec.dtype);
    for (int64_t extent : spec.shape) bytes = std::min<unsigned __int128>(bytes * uint64_t(std::max<int64_t>(extent, 0)), uint64_t(1) << 56);
    next += (static_cast<uint64_t>(bytes) + 511) / 256 * 256;
  };
  for (const auto& [name, spec] : input_specs(cfg)) place("in:" + name, spec);
  for (const auto& [name, spec] : output_specs(cfg, false)) place("out:" + name, spec);
}

void validate_case(expanse::context& ctx, const op_config& cfg) {
  struct verdict {
    expanse_status status;
  };
  prepared_run views(ctx, cfg, prepared_run::views_only{});
  try {
    views.execute([&](void* args) { throw verdict{expanse_supports(ctx.get(), cfg.op, args, nullptr, 0)}; });
  } catch (const verdict& v) {
    if (v.status != EXPANSE_OK) throw expanse::error(v.status, expanse_last_error());
  }
}

const expanse_tensor* prepared_run::in(const char* name) const {
  auto it = views_.find(std::string("in:") + name);
  return it == views_.end() ? nullptr : &it->second;
}

expanse_tensor* prepared_run::out(const char* name) {
  auto it = views_.find(std::string("out:") + name);
  return it == views_.end() ? nullptr : &it->second;
}

void prepared_run::execute(const std::function<void(void* args)>& adjust) {
  call_with_args([&](void* args) {
    if (adjust) adjust(args);
    ctx_.run(cfg_.op, args);
  });
}

void prepared_run::call_with_args(const std::function<void(void* args)>& call) {
  // The op's args filled by name through the library's tables: inputs from "in:", outputs and
  // in-place states from "out:", parameters from the config.
  const op_tables op = tables_of(cfg_.op);
  std::vector<unsigned char> storage(expanse_op_args_size(cfg_.op) + 16);
  void* args = storage.data() + (16 - reinterpret_cast<uintptr_t>(storage.data()) % 16) % 16;
  expanse::check(expanse_op_args_init(cfg_.op, args));
  fill_params(cfg_, op.params, args);
  for (const auto& t : op.tensors) {
    const expanse_tensor* view = t.role == EXPANSE_ARG_INPUT ? in(t.name) : out(t.name);
    std::memcpy(static_cast<char*>(args) + t.offset, &view, sizeof(view));
  }
  call(args);
}

tensor_map prepared_run::download() const {
  tensor_map result = outputs_;
  for (auto& [name, h] : result)
    ctx_.copy(h.bytes.data(), buffers_.at("out:" + name).data(), h.bytes.size(), EXPANSE_COPY_DEVICE_TO_HOST);
  ctx_.synchronize();
  return result;
}

tensor_map run_on(expanse::context& ctx, const op_config& cfg, const tensor_map& inputs, bool oracle) {
  prepared_run run(ctx, cfg, inputs, oracle);
  run.execute();
  return run.download();
}

double tolerance_for(expanse_dtype dtype) {
  switch (dtype) {
    case EXPANSE_F64: return 1e-12;
    case EXPANSE_F32: return 1e-5;
    case EXPANSE_F16: return 2e-3;
    case EXPANSE_BF16: return 5e-3;
  }
  return 0;
}

std::vector<comparison> compare(const tensor_map& out, const tensor_map& ref, double tolerance) {
  std::vector<comparison> result;
  for (const auto& [name, r] : ref) {
    comparison c;
    c.output = name;
    c.tolerance = tolerance;
    auto it = out.find(name);
    if (it == out.end() || it->second.numel() != r.numel()) {
      c.rel_error = INFINITY;
      result.push_back(c);
      continue;
    }
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      const double a = it->second.get(i), b = r.get(i);
      if (a == b && !std::isfinite(b)) continue;  // the same infinity (sequence_state's A after a reset)
      if (!std::isfinite(a) && std::isfinite(b)) {
        ++c.nonfinite;
        continue;
      }
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    c.rel_error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    c.pass = c.nonfinite == 0 && c.rel_error <= tolerance;
    result.push_back(c);
  }
  return result;
}

bool check_result::pass() const {
  if (!error.empty()) return false;
  if (!skipped.empty()) return true;
  for (const comparison& c : outputs)
    if (!c.pass) return false;
  return !outputs.empty();
}

std::string check_result::repro() const {
  return "expanse check " + cfg.label() + " --backend " + backend + " --seed " + std::to_string(seed);
}

check_result check_case(expanse::context& ctx, const op_config& cfg, uint64_t seed, const case_keeper& keep) {
  check_result r;
  r.cfg = cfg;
  r.seed = seed;
  r.backend = ctx.backend();
  try {
    validate_case(ctx, cfg);
    const tensor_map inputs = make_inputs(cfg, seed);
    // The backend runs before the oracle: the library's validation (and the backend's support
    // check) then rejects a bad case at once, not after seconds of oracle work.
    if (r.backend == "reference") {
      // The oracle itself is checked against the independent naive implementation, in f64.
      r.oracle = "naive f64";
      const tensor_map out = run_on(ctx, cfg, inputs, /*oracle=*/true);
      const tensor_map ref = naive::run(cfg, inputs);
      if (keep) keep(inputs, out, ref);
      r.outputs = compare(out, ref, tolerance_for(EXPANSE_F64));
    } else {
      r.oracle = "reference";
      const tensor_map out = run_on(ctx, cfg, inputs, /*oracle=*/false);
      expanse::context ref_ctx("reference");
      const tensor_map ref = run_on(ref_ctx, cfg, inputs, /*oracle=*/true);
      if (keep) keep(inputs, out, ref);
      r.outputs = compare(out, ref, tolerance_for(cfg.dtype));
    }
  } catch (const expanse::error& e) {
    if (e.status() == EXPANSE_ERROR_UNSUPPORTED) r.skipped = e.what();
    else r.error = e.what();
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace expanse::harness
