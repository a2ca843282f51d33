// `expanse check`: run operations on fresh random inputs on a backend and compare every output with
// the oracle (the reference backend; for the reference itself, the independent naive f64
// implementation), printing per-output relative errors against the docs/spec.md tolerance.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "case_options.hpp"
#include "cases.hpp"
#include "commands.hpp"
#include "npy.hpp"

using namespace expanse_cli;
namespace h = expanse::harness;

namespace {

const char kAbout[] =
    "Runs OP (or every operation) on fresh random inputs on a backend and compares each output with\n"
    "the oracle: the reference backend, or for `--backend reference` an independent naive f64\n"
    "implementation. Prints the relative Frobenius error ||out - ref|| / ||ref|| of every output with\n"
    "the docs/spec.md tolerance of the input dtype (f32 1e-5, f16 2e-3, bf16 5e-3, f64 1e-12). A case the\n"
    "backend declines is reported as SKIP with its reason. Exit status 1 on any failure.\n"
    "\n"
    "Without case options a few representative cases per operation run (--full: the whole shared case\n"
    "table of the test suite). With case options (--t, --p, ...) exactly one case of OP runs.\n"
    "Every failing case prints a command line that reruns it. When stderr is a terminal, the case\n"
    "being run is shown there.\n"
    "\n"
    "--save DIR (one case) writes what the case ran on as .npy files, to study a result in numpy:\n"
    "the inputs under their names, the backend's outputs as out_<name>, the oracle's as ref_<name>\n"
    "(bf16 widened to float32).\n";

void print_result(const h::check_result& r) {
  const char* verdict = !r.error.empty() ? "FAIL" : !r.skipped.empty() ? "SKIP" : r.pass() ? "PASS" : "FAIL";
  std::printf("%s  %s\n", verdict, r.cfg.label().c_str());
  if (!r.error.empty()) std::printf("      error: %s\n", r.error.c_str());
  if (!r.skipped.empty()) std::printf("      skipped: %s\n", r.skipped.c_str());
  for (const h::comparison& c : r.outputs) {
    std::printf("      %-7s rel. error %.3e  tolerance %.0e  vs %s%s%s\n", c.output.c_str(), c.rel_error, c.tolerance,
                r.oracle.c_str(), c.nonfinite ? "  NON-FINITE VALUES: " : "",
                c.nonfinite ? std::to_string(c.nonfinite).c_str() : "");
  }
  if (!r.pass()) std::printf("      repro: %s\n", r.repro().c_str());
}

struct CheckOptions {
  std::string op = "all";
  std::string backend;  // empty: expanse_default_backend()
  int32_t device = 0;
  std::optional<int64_t> seed;
  bool full = false;
  bool check_finite = false;
  std::string save_dir;  // empty: keep nothing
};

// Writes a case's tensors into dir as .npy (inputs by name, out_<name>, ref_<name>).
h::case_keeper saver(const std::string& dir) {
  return [dir](const h::tensor_map& inputs, const h::tensor_map& out, const h::tensor_map& ref) {
    std::filesystem::create_directories(dir);
    auto write = [&](const std::string& prefix, const h::tensor_map& tensors) {
      for (const auto& [name, t] : tensors)
        npy_write((std::filesystem::path(dir) / (prefix + name + ".npy")).string(), t.dtype, t.shape, t.bytes.data());
    };
    write("", inputs);
    write("out_", out);
    write("ref_", ref);
  };
}

int check(const CheckOptions& o, const CaseOptions& case_options) {
  const bool all_ops = o.op == "all";
  const expanse_op_kind op = all_ops ? EXPANSE_OP_COUNT : parse_op(o.op, "operation");
  if (all_ops && case_options.any())
    throw UsageError("check: case options (--t, --p, ...) need one operation name, not 'all'");
  if (!o.save_dir.empty() && !case_options.any())
    throw UsageError("check: --save needs one case (an operation and case options such as --t)");
  std::vector<h::op_config> cases;
  if (case_options.any()) {
    cases.push_back(case_options.apply(op, h::op_config{}));
  } else if (o.full) {
    for (const h::op_config& c : h::standard_cases())
      if (all_ops || c.op == op) cases.push_back(c);
  } else {
    for (int k = 0; k < EXPANSE_OP_COUNT; ++k)
      if (all_ops || k == op)
        for (const h::op_config& c : h::quick_cases(expanse_op_kind(k))) cases.push_back(c);
  }

  const std::string backend = o.backend.empty() ? expanse_default_backend() : o.backend;
  const uint64_t seed = static_cast<uint64_t>(o.seed ? *o.seed : std::random_device{}() & 0x7fffffff);
  expanse::context ctx(backend, o.device);
  if (o.check_finite) ctx.set_check_finite(true);
  std::printf("expanse check: backend %s, device %d, seed %llu\n", backend.c_str(), o.device,
              static_cast<unsigned long long>(seed));

  int passed = 0, failed = 0, skipped = 0;
  Progress progress(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    progress.show(i, cases[i].label());
    const h::check_result r = h::check_case(ctx, cases[i], seed + i, o.save_dir.empty() ? h::case_keeper{} : saver(o.save_dir));
    progress.clear();
    print_result(r);
    std::fflush(stdout);
    if (!r.pass()) ++failed;
    else if (!r.skipped.empty()) ++skipped;
    else ++passed;
  }
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}

}  // namespace

Command add_check(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("check", "compare a backend against the reference on random cases");
  set_usage(cmd, "[OP|all] [options]");
  cmd->footer(kAbout);
  auto o = std::make_shared<CheckOptions>();
  cmd->add_option("OP", o->op, "an operation (those of 'expanse run --help'), or all (the default)")
      ->type_name("");
  cmd->add_option("--backend", o->backend, "backend to check (default: $EXPANSE_BACKEND or reference)")
      ->type_name("NAME");
  cmd->add_option("--device", o->device, "device index (default 0)")->type_name("N")->check(in_range(0, 1 << 16));
  cmd->add_option("--seed", o->seed, "random seed (default: fresh, printed)")
      ->type_name("S")
      ->check(in_range(int64_t(0), INT64_MAX));
  cmd->add_flag("--full", o->full, "run the whole shared case table");
  cmd->add_option("--save", o->save_dir, "write the case's inputs and both outputs as .npy files into DIR")
      ->type_name("DIR");
  cmd->add_flag("--check-finite", o->check_finite, "let the library scan every input for NaN and infinity first");
  auto case_options = std::make_shared<CaseOptions>(cmd);
  return {cmd, [o, case_options] { return check(*o, *case_options); }};
}
