// `expanse bench`: time an operation over a grid of sequence lengths, one JSON object per line.
#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <cstdio>
#include <sstream>

#include "case_options.hpp"
#include "cases.hpp"
#include "commands.hpp"

using namespace expanse_cli;
namespace h = expanse::harness;

namespace {

const char kUsage[] =
    "usage: expanse bench OP [--backend NAME] [--device N] [--ts T1,T2,...] [--warmup N] [--reps N]\n"
    "                        [case options]\n"
    "\n"
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
    "the JSON gives the chunk size that ran and chunk_auto 1).\n";

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
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
    case expanse::ops::power_attention_step: return double(c.b) * (c.h * state + c.hq * state);
    case EXPANSE_OP_COUNT: break;
  }
  return 0;
}

constexpr int kInputSets = 4;
constexpr size_t kL2Bytes = 50u << 20;  // H100 L2

size_t input_bytes(const h::tensor_map& inputs) {
  size_t n = 0;
  for (const auto& [name, t] : inputs) n += t.bytes.size();
  return n;
}

// Cycles through the prepared input sets, one run each call.
struct rotation {
  std::vector<std::unique_ptr<h::prepared_run>>* runs;
  size_t index;
  std::string failure;  // an error inside the timed callback (exceptions must not cross the plugin)
  void next() { (*runs)[index++ % runs->size()]->execute(); }
  static void call(void* self) {
    rotation& r = *static_cast<rotation*>(self);
    try {
      if (r.failure.empty()) r.next();
    } catch (const std::exception& e) {
      r.failure = e.what();
    }
  }
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

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::vector<OptionSpec> specs = {
      {"backend", true, "NAME", "backend to time (default: $EXPANSE_BACKEND or reference)"},
      {"device", true, "N", "device index (default 0)"},
      {"ts", true, "T1,T2,..", "sequence lengths to time (default: --t)"},
      {"warmup", true, "N", "untimed runs first (default 3)"},
      {"reps", true, "N", "timed runs (default 10)"},
      {"seed", true, "S", "random seed (default 1)"},
      {"check-finite", false, "", "let the library scan every input for NaN and infinity (timed with it)"},
  };
  for (const OptionSpec& s : case_option_specs()) specs.push_back(s);
  ArgParser args("bench", specs);
  args.parse(argc, argv);
  if (args.help_requested()) {
    std::printf("%s\noptions:\n%s", kUsage, args.options_help().c_str());
    return 0;
  }
  if (args.positional().size() != 1) throw UsageError("bench: give exactly one operation name (see --help)");
  const expanse_op_kind op = parse_op(args.positional()[0], "operation");

  h::op_config p1;  // docs/performance.md config P1
  p1.b = 1; p1.t = 4096; p1.hq = p1.h = 8; p1.d = p1.e = 64; p1.p = 2; p1.c = 128;
  p1.dtype = EXPANSE_BF16; p1.gated = true; p1.normalize = true;
  if (op == expanse::ops::power_attention_step) p1.t = 1;
  h::op_config base = case_from_options(args, op, p1);

  std::vector<int64_t> ts;
  if (args.has("ts")) {
    std::stringstream list(args.get_string("ts", ""));
    for (std::string item; std::getline(list, item, ',');) ts.push_back(parse_int(item, "--ts", 1));
  } else {
    ts.push_back(base.t);
  }
  const int warmup = static_cast<int>(args.get_int("warmup", 3, 0, 1000));
  const int reps = static_cast<int>(args.get_int("reps", 10, 1, 100000));
  const uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 1, 0));
  const std::string backend = args.get_string("backend", expanse_default_backend());
  const int32_t device = static_cast<int32_t>(args.get_int("device", 0, 0, 1 << 16));

  expanse::context ctx(backend, device);
  if (args.get_flag("check-finite")) ctx.set_check_finite(true);
  expanse_device_info info;
  check_status(expanse_backend_device_info(backend.c_str(), device, &info), "device info");

  Progress progress(ts.size());
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    h::op_config cfg = base;
    cfg.t = ts[ti];
    progress.show(ti, std::string(expanse_op_name(op)) + " t=" + std::to_string(cfg.t) + ": " +
                          std::to_string(warmup) + " warm-up and " + std::to_string(reps) + " timed runs");
    h::validate_case(ctx, cfg);  // a bad case fails before its inputs are drawn
    // Several input sets, cycled, when they fit in the L2 cache together (so a run does not find
    // the previous run's inputs cached); one set otherwise.
    const size_t set_bytes = input_bytes(h::make_inputs(cfg, seed, /*consistent=*/false));
    const int sets = set_bytes * kInputSets <= kL2Bytes ? kInputSets : 1;
    std::vector<std::unique_ptr<h::prepared_run>> runs;
    for (int s = 0; s < sets; ++s)
      runs.push_back(std::make_unique<h::prepared_run>(ctx, cfg, h::make_inputs(cfg, seed + s, false), false));
    h::op_config ran = cfg;  // with the chunk size that runs, for the FLOP count and the JSON
    ran.c = resolved_chunk(ctx, *runs.front(), cfg);
    rotation rot{&runs, 0, {}};
    for (int i = 0; i < warmup; ++i) rot.next();
    ctx.synchronize();
    std::vector<float> device_ms(static_cast<size_t>(reps));
    const expanse_status timed = expanse_time_runs(ctx.get(), &rotation::call, &rot, reps, device_ms.data());
    if (timed != EXPANSE_OK && timed != EXPANSE_ERROR_UNSUPPORTED) throw expanse::error(timed, expanse_last_error());
    if (!rot.failure.empty()) throw std::runtime_error(rot.failure);
    const bool device_timer = timed == EXPANSE_OK;
    std::vector<double> ms;
    if (device_timer) {
      ms.assign(device_ms.begin(), device_ms.end());
    } else {
      for (int i = 0; i < reps; ++i) {
        const auto start = std::chrono::steady_clock::now();
        rot.next();
        ctx.synchronize();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2], flops = flop_count(ran);
    progress.clear();
    std::printf("{\"op\":\"%s\",\"backend\":\"%s\",\"device\":\"%s\",\"version\":\"%s\",\"config\":\"%s\","
                "\"b\":%lld,\"t\":%lld,\"hq\":%lld,\"h\":%lld,\"d\":%lld,\"e\":%lld,\"p\":%d,\"chunk\":%lld,\"chunk_auto\":%d,"
                "\"dtype\":\"%s\",\"gated\":%d,\"median_ms\":%.6g,\"min_ms\":%.6g,\"reps\":%d,\"flop\":%.6g,"
                "\"tflops\":%.6g,\"timer\":\"%s\",\"input_sets\":%d}\n",
                expanse_op_name(op), json_escape(backend).c_str(), json_escape(info.name).c_str(), expanse_version(),
                json_escape(cfg.label()).c_str(), (long long)cfg.b, (long long)cfg.t, (long long)cfg.hq,
                (long long)cfg.h, (long long)cfg.d, (long long)cfg.e, cfg.p, (long long)ran.c, int(cfg.c == EXPANSE_CHUNK_AUTO),
                expanse_dtype_name(cfg.dtype), int(cfg.gated), median, ms.front(), reps, flops,
                flops / (median * 1e-3) / 1e12, device_timer ? "device events" : "host clock", sets);
    std::fflush(stdout);
  }
  return 0;
}
