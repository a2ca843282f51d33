// The shared case table (core/harness/case_table.cpp) on every available backend: the reference
// against the independent naive f64 oracle, every other backend against the reference, within the
// docs/spec.md tolerances, outputs poisoned first.
#include <doctest/doctest.h>

#include "cases.hpp"
#include "test_seed.hpp"

namespace h = expanse::harness;

TEST_CASE("case table on every available backend") {
  const auto cases = h::standard_cases();
  for (const expanse_backend_info& info : expanse::backends()) {
    if (!info.available) {
      MESSAGE("skipped: backend '" << info.name << "' is unavailable: " << info.reason);
      continue;
    }
    expanse::context ctx(info.name);
    int passed = 0, skipped = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const h::check_result r = h::check_case(ctx, cases[i], test_seed() + i);
      INFO("backend " << info.name << ", seed " << r.seed << "; repro: " << r.repro());
      INFO("error: " << r.error);
      for (const h::comparison& c : r.outputs)
        INFO(c.output << ": rel. error " << c.rel_error << " (tolerance " << c.tolerance << "), non-finite "
                      << c.nonfinite);
      CHECK(r.pass());
      if (!r.skipped.empty()) ++skipped;
      else if (r.pass()) ++passed;
    }
    MESSAGE("backend '" << info.name << "': " << passed << " cases passed, " << skipped << " declined");
  }
}
