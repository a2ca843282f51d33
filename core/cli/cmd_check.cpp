// `expanse check`: run operations on fresh random inputs on a backend and compare every output with
// the oracle (the reference backend; for the reference itself, the independent naive f64
// implementation), printing per-output relative errors against the docs/spec.md tolerance.
#include <cstdio>
#include <random>

#include "case_options.hpp"
#include "cases.hpp"
#include "commands.hpp"

using namespace expanse_cli;
namespace h = expanse::harness;

namespace {

const char kUsage[] =
    "usage: expanse check [OP|all] [--backend NAME] [--device N] [--seed S] [--full] [case options]\n"
    "\n"
    "Runs OP (or every operation) on fresh random inputs on a backend and compares each output with\n"
    "the oracle: the reference backend, or for `--backend reference` an independent naive f64\n"
    "implementation. Prints the relative Frobenius error ||out - ref|| / ||ref|| of every output with\n"
    "the docs/spec.md tolerance of the input dtype (f32 1e-5, f16 2e-3, bf16 5e-3, f64 1e-12). A case the\n"
    "backend declines is reported as SKIP with its reason. Exit status 1 on any failure.\n"
    "\n"
    "Without case options a few representative cases per operation run (--full: the whole shared case\n"
    "table of the test suite). With case options (--t, --p, ...) exactly one case of OP runs.\n"
    "Every failing case prints a command line that reruns it. When stderr is a terminal, the case\n"
    "being run is shown there.\n";

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

}  // namespace

int cmd_check(int argc, char** argv) {
  std::vector<OptionSpec> specs = {
      {"backend", true, "NAME", "backend to check (default: $EXPANSE_BACKEND or reference)"},
      {"device", true, "N", "device index (default 0)"},
      {"seed", true, "S", "random seed (default: fresh, printed)"},
      {"full", false, "", "run the whole shared case table"},
      {"check-finite", false, "", "let the library scan every input for NaN and infinity first"},
  };
  for (const OptionSpec& s : case_option_specs()) specs.push_back(s);
  ArgParser args("check", specs);
  args.parse(argc, argv);
  if (args.help_requested()) {
    std::printf("%s\noptions:\n%s", kUsage, args.options_help().c_str());
    return 0;
  }
  if (args.positional().size() > 1) throw UsageError("check: at most one operation name, got several");
  const std::string op_text = args.positional().empty() ? "all" : args.positional()[0];
  const bool all_ops = op_text == "all";
  const expanse_op_kind op = all_ops ? EXPANSE_OP_COUNT : parse_op(op_text, "operation");
  if (all_ops && has_case_options(args))
    throw UsageError("check: case options (--t, --p, ...) need one operation name, not 'all'");

  const std::string backend = args.get_string("backend", expanse_default_backend());
  const int32_t device = static_cast<int32_t>(args.get_int("device", 0, 0, 1 << 16));
  const uint64_t seed = args.has("seed") ? static_cast<uint64_t>(args.get_int("seed", 0, 0))
                                         : static_cast<uint64_t>(std::random_device{}() & 0x7fffffff);
  expanse::context ctx(backend, device);
  if (args.get_flag("check-finite")) ctx.set_check_finite(true);
  std::printf("expanse check: backend %s, device %d, seed %llu\n", backend.c_str(), device,
              static_cast<unsigned long long>(seed));

  std::vector<h::op_config> cases;
  if (has_case_options(args)) {
    cases.push_back(case_from_options(args, op, h::op_config{}));
  } else if (args.get_flag("full")) {
    for (const h::op_config& c : h::standard_cases())
      if (all_ops || c.op == op) cases.push_back(c);
  } else {
    for (int k = 0; k < EXPANSE_OP_COUNT; ++k)
      if (all_ops || k == op)
        for (const h::op_config& c : h::quick_cases(expanse_op_kind(k))) cases.push_back(c);
  }

  int passed = 0, failed = 0, skipped = 0;
  Progress progress(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    progress.show(i, cases[i].label());
    const h::check_result r = h::check_case(ctx, cases[i], seed + i);
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
