// `expanse bench`: time an operation over a grid of sequence lengths, one JSON object per line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "case_options.hpp"
#include "cases.hpp"
#include "commands.hpp"

using namespace expanse_cli;
namespace h = expanse::harness;

namespace {

const char kAbout[] =
    "Times OP on random inputs (never zeros) after warm-up runs and prints one JSON object per line:\n"
    "the configuration, backend, device, median/min time in ms over --reps runs, and the achieved\n"
    "TFLOP/s by the FLOP count of docs/performance.md (update_state 2De per token and kv head, query_state\n"
    "2De per token and query head, intra-chunk attention c(d+e) per token and query head). Each run is\n"
    "timed with the backend's device events (CUDA events) where it has them, else with a host clock to\n"
    "completion of the device work; up to 4 input sets are cycled when they fit in L2 together.\n"
    "--ts gives a list of sequence lengths (default: --t). When stderr is a terminal, the length being\n"
    "timed is shown there.\n"
    "Defaults are config P1 of docs/performance.md: b=1, h=hq=8, d=e=64, p=2, bf16, gated, t=4096,\n"
    "chunk 128; power_attention's chunk is auto (the library's choice, run untimed once to read it;\n"
    "the JSON gives the chunk size that ran and chunk_auto 1). power_attention_backward is timed three\n"
    "ways, one line each with \"pass\": its forward (fwd), itself (bwd) and both in a row (fwd+bwd).\n";

// x to 6 significant digits: timings and rates, without the noise of float-to-double conversion.
double significant6(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", x);
  return std::strtod(text, nullptr);
}

// Forward FLOPs by docs/performance.md's model (the chunked algorithm; quadratic for c = 0).
double flop_count(const h::op_config& c) {
  const double D = c.op == expanse::ops::discumsum ? 0 : double(expanse::expanded_dim(c.p, c.d, c.layout));
  const double tokens = double(c.b) * double(c.t);
  const double chunk = c.c > 0 ? double(std::min(c.c, c.t)) : double(c.t);
  const double state = 2.0 * D * double(c.e);
  const double intra = chunk * double(c.d + c.e);  // causal half of QK^T and PV
  switch (c.op) {
    case expanse::ops::sympow_expand: return double(c.t) * D * c.p;
    case expanse::ops::update_state: return tokens * c.h * state;
    case expanse::ops::discumsum: return double(c.b) * c.h * double(h::chunk_count(c.t, std::max<int64_t>(c.c, 1))) * c.d * c.e * 2.0;
    case expanse::ops::query_state: return tokens * c.hq * state;
    case expanse::ops::chunk_attention: return tokens * c.hq * intra;
    case expanse::ops::power_attention:
      if (c.c == 0) return tokens * c.hq * intra;
      return tokens * (c.h * state + c.hq * state + c.hq * intra);
    case expanse::ops::power_attention_step: return tokens * (c.h * state + c.hq * state);  // the recurrence's
    case expanse::ops::power_attention_backward: {
      // The chunked backward of docs/spec.md: the forward states again (h), the cotangent states (hq),
      // dq from the states (hq), dk and dv from the cotangent states (2h); inside the chunks the scores
      // again, dnum . v, dq, dk (3 d) and dnum . v, dv (2 e) over the causal half.
      const double intra_bwd = chunk * double(3 * c.d + 2 * c.e);
      if (c.c == 0) return tokens * c.hq * intra_bwd;
      return tokens * (3 * c.h * state + 2 * c.hq * state + c.hq * intra_bwd);
    }
    // The core operations' backwards: two state products each (update_state: dk, dv; query_state: dq,
    // dS), discumsum twice over (dX, dA), and the pairs' five products.
    case expanse::ops::update_state_backward: return 2 * tokens * c.h * state;
    case expanse::ops::discumsum_backward: {
      h::op_config forward = c;
      forward.op = expanse::ops::discumsum;
      return 2 * flop_count(forward);
    }
    case expanse::ops::query_state_backward: return 2 * tokens * c.hq * state;
    case expanse::ops::chunk_attention_backward: return tokens * c.hq * chunk * double(3 * c.d + 2 * c.e);
    case expanse::ops::sequence_state: return tokens * c.h * state;  // update_state's (the scan is small)
    case EXPANSE_OP_COUNT: break;
  }
  return 0;
}

constexpr int kInputSets = 4;
constexpr size_t kL2Bytes = 50u << 20;  // H100 L2

// The bytes of cfg's inputs, from their shapes (drawing them takes seconds at 64k tokens).
size_t input_bytes(const h::op_config& cfg) {
  size_t n = 0;
  for (const auto& [name, spec] : h::input_specs(cfg)) {
    size_t elements = 1;
    for (int64_t s : spec.shape) elements *= size_t(s);
    n += elements * expanse_dtype_size(spec.dtype);
  }
  return n;
}

// Calls `step` from inside the timer (exceptions must not cross the plugin: the first one is kept).
struct timed_step {
  std::function<void()> step;
  std::string failure;
  static void call(void* self) {
    timed_step& r = *static_cast<timed_step*>(self);
    try {
      if (r.failure.empty()) r.step();
    } catch (const std::exception& e) {
      r.failure = e.what();
    }
  }
};

// Times `step` `reps` times after `warmup` untimed calls: with the backend's device events where it
// has them (device_timer), else with a host clock to completion. Sorted, in ms.
std::vector<double> time_step(expanse::context& ctx, const std::function<void()>& step, int warmup, int reps,
                              bool& device_timer) {
  for (int i = 0; i < warmup; ++i) step();
  ctx.synchronize();
  timed_step ts{step, {}};
  std::vector<float> device_ms(static_cast<size_t>(reps));
  const expanse_status timed = expanse_time_runs(ctx.get(), &timed_step::call, &ts, reps, device_ms.data());
  if (timed != EXPANSE_OK && timed != EXPANSE_ERROR_UNSUPPORTED) throw expanse::error(timed, expanse_last_error());
  if (!ts.failure.empty()) throw std::runtime_error(ts.failure);
  device_timer = timed == EXPANSE_OK;
  std::vector<double> ms(device_ms.begin(), device_ms.end());
  if (!device_timer) {
    ms.clear();
    for (int i = 0; i < reps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      step();
      ctx.synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

// Up to kInputSets prepared runs of cfg, cycled by next() (several when they fit in the L2 cache
// together, so that a run does not find the previous run's inputs cached).
struct input_sets {
  std::vector<h::tensor_map> host;  // each run's inputs
  std::vector<std::unique_ptr<h::prepared_run>> runs;
  size_t index = 0;
  input_sets(expanse::context& ctx, const h::op_config& cfg, uint64_t seed) {
    // A backward's o from the timed backend's forward: the naive oracle would take minutes at 64k tokens.
    const h::forward_runner forward = [&](const h::op_config& f, const h::tensor_map& in) {
      return h::run_on(ctx, f, in, /*oracle=*/false);
    };
    const int sets = input_bytes(cfg) * kInputSets <= kL2Bytes ? kInputSets : 1;
    for (int s = 0; s < sets; ++s) {
      host.push_back(h::make_inputs(cfg, seed + s, false, forward));
      runs.push_back(std::make_unique<h::prepared_run>(ctx, cfg, host.back(), false));
    }
  }
  // cfg's runs on the inputs of `from`, whose op takes all of cfg's and more (a backward's, for its
  // forward): the same tokens for both, drawn once (seconds per million tokens).
  input_sets(expanse::context& ctx, const h::op_config& cfg, const input_sets& from) {
    for (const h::tensor_map& inputs : from.host) {
      h::tensor_map own;
      for (const auto& [name, spec] : h::input_specs(cfg)) own.emplace(name, inputs.at(name));
      runs.push_back(std::make_unique<h::prepared_run>(ctx, cfg, own, false));
    }
  }
  void next() { runs[index++ % runs.size()]->execute(); }
};

// The chunk size power_attention runs with: the backend's choice for auto, read from the arguments
// of one (untimed) run; cfg.c otherwise.
int64_t resolved_chunk(expanse::context& ctx, h::prepared_run& run, const h::op_config& cfg) {
  if (cfg.op != expanse::ops::power_attention || cfg.c != EXPANSE_CHUNK_AUTO) return cfg.c;
  int64_t chunk = cfg.c;
  run.execute([&](void* args) {
    expanse::check(expanse_resolved_chunk_size(ctx.get(), static_cast<const expanse_power_attention_args*>(args), &chunk));
  });
  return chunk;
}

// The workspace a run of `run` takes (expanse_workspace_size on its arguments, in one untimed run):
// the memory an operation needs beyond its inputs and outputs.
size_t workspace_bytes(expanse::context& ctx, h::prepared_run& run, expanse_op_kind op) {
  size_t bytes = 0;
  run.execute([&](void* args) { expanse::check(expanse_workspace_size(ctx.get(), op, args, &bytes)); });
  return bytes;
}

struct BenchOptions {
  std::string op;
  std::string backend;  // empty: expanse_default_backend()
  int32_t device = 0;
  std::vector<int64_t> ts;
  int warmup = 3, reps = 10;
  int64_t seed = 1;
  bool check_finite = false;
};

int bench(const BenchOptions& o, const CaseOptions& case_options) {
  if (o.op.empty()) throw UsageError("expanse bench needs an operation: one of " + op_names_list());
  const expanse_op_kind op = parse_op(o.op, "operation");
  h::op_config p1;  // docs/performance.md config P1
  p1.b = 1; p1.t = 4096; p1.hq = p1.h = 8; p1.d = p1.e = 64; p1.p = 2; p1.c = 128;
  p1.dtype = EXPANSE_BF16; p1.gated = true; p1.normalize = true;
  if (op == expanse::ops::power_attention_step) p1.t = 1;
  const h::op_config base = case_options.apply(op, p1);
  const std::vector<int64_t> ts = o.ts.empty() ? std::vector<int64_t>{base.t} : o.ts;
  const int warmup = o.warmup, reps = o.reps;
  const uint64_t seed = static_cast<uint64_t>(o.seed);
  const std::string backend = o.backend.empty() ? expanse_default_backend() : o.backend;
  const int32_t device = o.device;

  expanse::context ctx(backend, device);
  if (o.check_finite) ctx.set_check_finite(true);
  expanse_device_info info;
  check_status(expanse_backend_device_info(backend.c_str(), device, &info), "device info");

  Progress progress(ts.size());
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    h::op_config cfg = base;
    cfg.t = ts[ti];
    progress.show(ti, std::string(expanse_op_name(op)) + " t=" + std::to_string(cfg.t) + ": " +
                          std::to_string(warmup) + " warm-up and " + std::to_string(reps) + " timed runs");
    h::validate_case(ctx, cfg);  // a bad case fails before its inputs are drawn
    input_sets sets(ctx, cfg, seed);
    h::op_config ran = cfg;  // with the chunk size that runs, for the FLOP count and the JSON
    ran.c = resolved_chunk(ctx, *sets.runs.front(), cfg);
    // A backward is timed three ways: its forward, itself, and both in a row (a training step's).
    // Its chunk size is read from its forward's (the backend's rule sees the same problem).
    // Each pass with the workspace it needs: a context reuses one workspace, so a training step's
    // extra memory is the larger of its forward's and its backward's.
    std::vector<std::tuple<const char*, std::function<void()>, size_t>> passes;
    std::unique_ptr<input_sets> forward_sets;
    h::op_config fwd = cfg;
    const size_t own_workspace = workspace_bytes(ctx, *sets.runs.front(), op);
    if (op == expanse::ops::power_attention_backward) {
      fwd.op = expanse::ops::power_attention;
      forward_sets = std::make_unique<input_sets>(ctx, fwd, sets);
      ran.c = fwd.c = resolved_chunk(ctx, *forward_sets->runs.front(), fwd);
      const size_t fwd_workspace = workspace_bytes(ctx, *forward_sets->runs.front(), fwd.op);
      passes = {{"fwd", [&] { forward_sets->next(); }, fwd_workspace},
                {"bwd", [&] { sets.next(); }, own_workspace},
                {"fwd+bwd", [&] { forward_sets->next(); sets.next(); }, std::max(fwd_workspace, own_workspace)}};
    } else {
      passes = {{"", [&] { sets.next(); }, own_workspace}};
    }
    progress.clear();
    for (const auto& [pass, step, workspace] : passes) {
      bool device_timer = false;
      const std::vector<double> ms = time_step(ctx, step, warmup, reps, device_timer);
      const std::string name = pass;
      const double median = ms[ms.size() / 2];
      const double flops = name == "fwd" ? flop_count(fwd) : name == "fwd+bwd" ? flop_count(fwd) + flop_count(ran)
                                                                                : flop_count(ran);
      nlohmann::ordered_json line = {
          {"op", expanse_op_name(op)}, {"backend", backend}, {"device", std::string(info.name)},
          {"version", expanse_version()}, {"config", cfg.label()}, {"b", cfg.b}, {"t", cfg.t}, {"hq", cfg.hq},
          {"h", cfg.h}, {"d", cfg.d}, {"e", cfg.e}, {"p", cfg.p}, {"chunk", ran.c},
          {"chunk_auto", int(cfg.c == EXPANSE_CHUNK_AUTO)}, {"dtype", expanse_dtype_name(cfg.dtype)},
          {"gated", int(cfg.gated)}, {"median_ms", significant6(median)}, {"min_ms", significant6(ms.front())},
          {"reps", reps}, {"flop", flops}, {"tflops", significant6(flops / (median * 1e-3) / 1e12)},
          {"timer", device_timer ? "device events" : "host clock"}, {"input_sets", int(sets.runs.size())},
          {"workspace_bytes", workspace}};
      if (!name.empty()) line["pass"] = name;
      std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

Command add_bench(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "time operations on a backend");
  set_usage(cmd, "OP [options]");
  cmd->footer(kAbout);
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("OP", o->op, "an operation (those of 'expanse run --help')")->type_name("");
  cmd->add_option("--backend", o->backend, "backend to time (default: $EXPANSE_BACKEND or reference)")
      ->type_name("NAME");
  cmd->add_option("--device", o->device, "device index (default 0)")->type_name("N")->check(in_range(0, 1 << 16));
  cmd->add_option("--ts", o->ts, "sequence lengths to time (default: --t)")
      ->option_text("T1,T2,...")->delimiter(',')->check(in_range(int64_t(1), INT64_MAX));
  cmd->add_option("--warmup", o->warmup, "untimed runs first (default 3)")->type_name("N")->check(in_range(0, 1000));
  cmd->add_option("--reps", o->reps, "timed runs (default 10)")->type_name("N")->check(in_range(1, 100000));
  cmd->add_option("--seed", o->seed, "random seed (default 1)")->type_name("S")->check(in_range(int64_t(0), INT64_MAX));
  cmd->add_flag("--check-finite", o->check_finite,
                "let the library scan every input for NaN and infinity (timed with it)");
  auto case_options = std::make_shared<CaseOptions>(cmd);
  return {cmd, [o, case_options] { return bench(*o, *case_options); }};
}
