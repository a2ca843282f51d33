// Random inputs, runs on any backend, and comparison with an oracle (see cases.hpp).
#include "cases.hpp"

#include <cmath>
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
// With `resets`, about one gate in six is exactly 0 (log_g = -inf): a reset.
host_tensor log_gate_tensor(expanse_dtype dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                            bool resets = false) {
  host_tensor t = host_tensor::zeros(dtype, std::move(shape));
  std::normal_distribution<double> dist(1.0, 1.0);
  std::uniform_int_distribution<int> die(0, 5);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = dist(rng);
    const bool reset = resets && die(rng) == 0;
    t.set(i, reset ? -std::numeric_limits<double>::infinity() : -std::log1p(std::exp(-x)));
  }
  return t;
}

host_tensor cast(const host_tensor& src, expanse_dtype dtype) {
  host_tensor t = host_tensor::zeros(dtype, src.shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, src.get(i));
  return t;
}

// A state (S [b,h,D,e], z [b,h,D]) as left by a short random gated sequence: realistic magnitudes
// and, for even p, a positive denominator phi(q)^T z.
void random_state(const op_config& cfg, std::mt19937_64& rng, host_tensor& S, host_tensor& z) {
  op_config prefix = cfg;
  prefix.op = EXPANSE_OP_POWER_ATTENTION;
  prefix.t = 7;
  prefix.hq = cfg.h;
  prefix.initial_state = false;
  prefix.final_state = true;
  prefix.normalize = true;  // so that the oracle also produces z
  tensor_map in;
  in["q"] = normal_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h, cfg.d}, rng);
  in["k"] = normal_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h, cfg.d}, rng);
  in["v"] = normal_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h, cfg.e}, rng);
  if (cfg.gated) in["log_g"] = log_gate_tensor(EXPANSE_F64, {cfg.b, prefix.t, cfg.h}, rng, cfg.resets);
  prefix.gated = cfg.gated;
  tensor_map out = naive::run(prefix, in);
  S = cast(out.at("S"), state_dtype(cfg));
  z = cast(out.at("z"), state_dtype(cfg));
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
  if (scale != 0.0) s << " --scale " << scale;
  return s.str();
}

tensor_map make_inputs(const op_config& cfg, uint64_t seed, bool consistent) {
  std::mt19937_64 rng(seed);
  const expanse_dtype dt = cfg.dtype, st = state_dtype(cfg);
  const int64_t n = chunk_count(cfg);
  tensor_map in;
  auto tokens = [&](bool with_q) {
    if (with_q) in["q"] = normal_tensor(dt, {cfg.b, cfg.t, cfg.hq, cfg.d}, rng);
    in["k"] = normal_tensor(dt, {cfg.b, cfg.t, cfg.h, cfg.d}, rng);
    in["v"] = normal_tensor(dt, {cfg.b, cfg.t, cfg.h, cfg.e}, rng);
    if (cfg.gated) in["log_g"] = log_gate_tensor(st, {cfg.b, cfg.t, cfg.h}, rng, cfg.resets);
  };
  switch (cfg.op) {
    case EXPANSE_OP_SYMPOW_EXPAND:
      in["x"] = normal_tensor(dt, {cfg.t, cfg.d}, rng);
      break;
    case EXPANSE_OP_UPDATE_STATE:
      tokens(false);
      break;
    case EXPANSE_OP_DISCUMSUM:
      in["X"] = normal_tensor(dt, {cfg.b, n, cfg.h, cfg.d, cfg.e}, rng);
      in["A"] = log_gate_tensor(st, {cfg.b, n, cfg.h}, rng, cfg.resets);
      if (cfg.initial_state) in["Y_init"] = normal_tensor(dt, {cfg.b, cfg.h, cfg.d, cfg.e}, rng);
      break;
    case EXPANSE_OP_QUERY_STATE: {
      // Consistent inputs: states entering each chunk and the intra-chunk result of one random
      // sequence, computed by the naive oracle.
      tokens(true);
      const int64_t D = expanse::expanded_dim(cfg.p, cfg.d, cfg.layout);
      if (!consistent) {
        in["S"] = normal_tensor(st, {cfg.b, n, cfg.h, D, cfg.e}, rng);
        if (cfg.normalize) in["z"] = normal_tensor(st, {cfg.b, n, cfg.h, D}, rng);
        if (cfg.intra) {
          in["y"] = normal_tensor(st, {cfg.b, cfg.t, cfg.hq, cfg.e}, rng);
          in["l"] = normal_tensor(st, {cfg.b, cfg.t, cfg.hq}, rng);
          in["rowmax"] = normal_tensor(st, {cfg.b, cfg.t, cfg.hq}, rng);
        }
        in.erase("k");
        in.erase("v");
        break;
      }
      op_config u = cfg;
      u.op = EXPANSE_OP_UPDATE_STATE;
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
        ca.op = EXPANSE_OP_CHUNK_ATTENTION;
        tensor_map intra = naive::run(ca, in);
        for (const char* name : {"y", "l", "rowmax"}) in[name] = cast(intra.at(name), st);
      }
      in.erase("k");
      in.erase("v");
      break;
    }
    case EXPANSE_OP_CHUNK_ATTENTION:
      tokens(true);
      break;
    case EXPANSE_OP_POWER_ATTENTION:
      tokens(true);
      if (cfg.initial_state) {
        host_tensor S, z;
        random_state(cfg, rng, S, z);
        in["S0"] = S;
        if (cfg.normalize) in["z0"] = z;
      }
      break;
    case EXPANSE_OP_POWER_ATTENTION_STEP: {
      in["q"] = normal_tensor(dt, {cfg.b, cfg.hq, cfg.d}, rng);
      in["k"] = normal_tensor(dt, {cfg.b, cfg.h, cfg.d}, rng);
      in["v"] = normal_tensor(dt, {cfg.b, cfg.h, cfg.e}, rng);
      if (cfg.gated) in["log_g"] = log_gate_tensor(st, {cfg.b, cfg.h}, rng, cfg.resets);
      host_tensor S, z;
      random_state(cfg, rng, S, z);
      in["S"] = S;
      if (cfg.normalize) in["z"] = z;
      break;
    }
    case EXPANSE_OP_COUNT: break;
  }
  return in;
}

spec_map input_specs(const op_config& cfg) {
  const expanse_dtype dt = cfg.dtype, st = state_dtype(cfg);
  const int64_t n = chunk_count(cfg), b = cfg.b, t = cfg.t, h = cfg.h, hq = cfg.hq, d = cfg.d, e = cfg.e;
  auto D = [&] { return expanse::expanded_dim(cfg.p, d, cfg.layout); };
  spec_map in;
  auto tokens = [&](bool with_q, bool with_kv) {
    if (with_q) in["q"] = {dt, {b, t, hq, d}};
    if (with_kv) {
      in["k"] = {dt, {b, t, h, d}};
      in["v"] = {dt, {b, t, h, e}};
    }
    if (cfg.gated) in["log_g"] = {st, {b, t, h}};
  };
  switch (cfg.op) {
    case EXPANSE_OP_SYMPOW_EXPAND: in["x"] = {dt, {t, d}}; break;
    case EXPANSE_OP_UPDATE_STATE: tokens(false, true); break;
    case EXPANSE_OP_DISCUMSUM:
      in["X"] = {dt, {b, n, h, d, e}};
      in["A"] = {st, {b, n, h}};
      if (cfg.initial_state) in["Y_init"] = {dt, {b, h, d, e}};
      break;
    case EXPANSE_OP_QUERY_STATE:
      tokens(true, false);
      in["S"] = {st, {b, n, h, D(), e}};
      if (cfg.normalize) in["z"] = {st, {b, n, h, D()}};
      if (cfg.intra) {
        in["y"] = {st, {b, t, hq, e}};
        in["l"] = {st, {b, t, hq}};
        in["rowmax"] = {st, {b, t, hq}};
      }
      break;
    case EXPANSE_OP_CHUNK_ATTENTION: tokens(true, true); break;
    case EXPANSE_OP_POWER_ATTENTION:
      tokens(true, true);
      if (cfg.initial_state) {
        in["S0"] = {st, {b, h, D(), e}};
        if (cfg.normalize) in["z0"] = {st, {b, h, D()}};
      }
      break;
    case EXPANSE_OP_POWER_ATTENTION_STEP:
      in["q"] = {dt, {b, hq, d}};
      in["k"] = {dt, {b, h, d}};
      in["v"] = {dt, {b, h, e}};
      if (cfg.gated) in["log_g"] = {st, {b, h}};
      in["S"] = {st, {b, h, D(), e}};
      if (cfg.normalize) in["z"] = {st, {b, h, D()}};
      break;
    case EXPANSE_OP_COUNT: break;
  }
  return in;
}

spec_map output_specs(const op_config& cfg, bool oracle) {
  const expanse_dtype token = oracle ? EXPANSE_F64 : cfg.dtype;
  const expanse_dtype st = oracle ? EXPANSE_F64 : state_dtype(cfg);
  const int64_t n = chunk_count(cfg), b = cfg.b, t = cfg.t, h = cfg.h, hq = cfg.hq, e = cfg.e;
  auto D = [&] { return expanse::expanded_dim(cfg.p, cfg.d, cfg.layout); };
  spec_map out;
  switch (cfg.op) {
    case EXPANSE_OP_SYMPOW_EXPAND: out["out"] = {token, {t, D()}}; break;
    case EXPANSE_OP_UPDATE_STATE:
      out["S"] = {st, {b, n, h, D(), e}};
      out["z"] = {st, {b, n, h, D()}};
      break;
    case EXPANSE_OP_DISCUMSUM: out["Y"] = {st, {b, n + 1, h, cfg.d, e}}; break;
    case EXPANSE_OP_QUERY_STATE: out["o"] = {token, {b, t, hq, e}}; break;
    case EXPANSE_OP_CHUNK_ATTENTION:
      out["y"] = {st, {b, t, hq, e}};
      out["l"] = {st, {b, t, hq}};
      out["rowmax"] = {st, {b, t, hq}};
      break;
    case EXPANSE_OP_POWER_ATTENTION:
      out["o"] = {token, {b, t, hq, e}};
      if (cfg.final_state) {
        out["S"] = {st, {b, h, D(), e}};
        if (cfg.normalize) out["z"] = {st, {b, h, D()}};
      }
      break;
    case EXPANSE_OP_POWER_ATTENTION_STEP:
      out["o"] = {token, {b, hq, e}};
      out["S"] = {st, {b, h, D(), e}};
      if (cfg.normalize) out["z"] = {st, {b, h, D()}};
      break;
    case EXPANSE_OP_COUNT: break;
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
    views_[name] = expanse::tensor_of(buf.data(), h.dtype, h.shape, device);
    buffers_[name] = std::move(buf);
  };
  for (const auto& [name, h] : inputs) upload("in:" + name, h);
  for (const auto& [name, h] : outputs_) {
    auto it = inputs.find(name);
    host_tensor initial = h;
    if (cfg.op == EXPANSE_OP_POWER_ATTENTION_STEP && it != inputs.end()) {
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
                                      ctx.device_type());
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
  const op_config& cfg = cfg_;
  expanse::context& ctx = ctx_;
  switch (cfg.op) {
    case EXPANSE_OP_SYMPOW_EXPAND: {
      auto a = expanse::sympow_expand_args();
      a.x = in("x"); a.out = out("out"); a.p = cfg.p; a.layout = cfg.layout;
      if (adjust) adjust(&a);
      ctx.sympow_expand(a);
      break;
    }
    case EXPANSE_OP_UPDATE_STATE: {
      auto a = expanse::update_state_args();
      a.k = in("k"); a.v = in("v"); a.log_g = in("log_g"); a.S = out("S"); a.z = out("z");
      a.p = cfg.p; a.chunk_size = cfg.c; a.layout = cfg.layout;
      if (adjust) adjust(&a);
      ctx.update_state(a);
      break;
    }
    case EXPANSE_OP_DISCUMSUM: {
      auto a = expanse::discumsum_args();
      a.X = in("X"); a.A = in("A"); a.Y_init = in("Y_init"); a.Y = out("Y");
      if (adjust) adjust(&a);
      ctx.discumsum(a);
      break;
    }
    case EXPANSE_OP_QUERY_STATE: {
      auto a = expanse::query_state_args();
      a.q = in("q"); a.S = in("S"); a.z = in("z"); a.log_g = in("log_g");
      a.y = in("y"); a.l = in("l"); a.rowmax = in("rowmax"); a.o = out("o");
      a.p = cfg.p; a.scale = cfg.scale; a.chunk_size = cfg.c; a.normalize = cfg.normalize; a.layout = cfg.layout;
      if (adjust) adjust(&a);
      ctx.query_state(a);
      break;
    }
    case EXPANSE_OP_CHUNK_ATTENTION: {
      auto a = expanse::chunk_attention_args();
      a.q = in("q"); a.k = in("k"); a.v = in("v"); a.log_g = in("log_g");
      a.y = out("y"); a.l = out("l"); a.rowmax = out("rowmax");
      a.p = cfg.p; a.scale = cfg.scale; a.chunk_size = cfg.c;
      if (adjust) adjust(&a);
      ctx.chunk_attention(a);
      break;
    }
    case EXPANSE_OP_POWER_ATTENTION: {
      auto a = expanse::power_attention_args();
      a.q = in("q"); a.k = in("k"); a.v = in("v"); a.log_g = in("log_g");
      a.initial_S = in("S0"); a.initial_z = in("z0"); a.o = out("o"); a.final_S = out("S"); a.final_z = out("z");
      a.p = cfg.p; a.scale = cfg.scale; a.chunk_size = cfg.c; a.normalize = cfg.normalize; a.layout = cfg.layout;
      if (adjust) adjust(&a);
      ctx.power_attention(a);
      break;
    }
    case EXPANSE_OP_POWER_ATTENTION_STEP: {
      auto a = expanse::power_attention_step_args();
      a.q = in("q"); a.k = in("k"); a.v = in("v"); a.log_g = in("log_g");
      a.S = out("S"); a.z = out("z"); a.o = out("o");
      a.p = cfg.p; a.scale = cfg.scale; a.normalize = cfg.normalize; a.layout = cfg.layout;
      if (adjust) adjust(&a);
      ctx.power_attention_step(a);
      break;
    }
    case EXPANSE_OP_COUNT: break;
  }
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

check_result check_case(expanse::context& ctx, const op_config& cfg, uint64_t seed) {
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
      r.outputs = compare(out, ref, tolerance_for(EXPANSE_F64));
    } else {
      r.oracle = "reference";
      const tensor_map out = run_on(ctx, cfg, inputs, /*oracle=*/false);
      expanse::context ref_ctx("reference");
      const tensor_map ref = run_on(ref_ctx, cfg, inputs, /*oracle=*/true);
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
