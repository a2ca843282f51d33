// The harness's rounding of f64 to f16 and bf16 (every input of the checks and benchmarks goes
// through it): each bit pattern converts back to itself, values halfway between two neighbours go
// to the even one, and values beyond the largest finite one become infinity.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "cases.hpp"

namespace h = expanse::harness;

namespace {

struct format {
  const char* name;
  double (*to_double)(uint16_t);
  uint16_t (*from_double)(double);
  int mantissa_bits;
};
const format kFormats[] = {{"f16", h::f16_to_double, h::double_to_f16, 10},
                           {"bf16", h::bf16_to_double, h::double_to_bf16, 7}};

bool is_nan_pattern(uint16_t bits, int mantissa_bits) {
  const int exponent_bits = 15 - mantissa_bits;
  const uint32_t exponent = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1u);
  return exponent == (1u << exponent_bits) - 1u && (bits & ((1u << mantissa_bits) - 1u)) != 0;
}

}  // namespace

TEST_CASE("f16 and bf16: every bit pattern converts back to itself") {
  for (const format& f : kFormats) {
    CAPTURE(f.name);
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      const uint16_t b = static_cast<uint16_t>(bits);
      if (is_nan_pattern(b, f.mantissa_bits)) {
        CHECK(std::isnan(f.to_double(f.from_double(f.to_double(b)))));
        continue;
      }
      if (f.from_double(f.to_double(b)) != b) FAIL_CHECK("pattern " << bits << " came back as " << f.from_double(f.to_double(b)));
    }
  }
}

TEST_CASE("f16 and bf16: halfway values round to even, overflow gives infinity") {
  for (const format& f : kFormats) {
    CAPTURE(f.name);
    // Between every pair of neighbouring finite positive values (normal and subnormal), the midpoint
    // goes to the one whose last bit is 0, and a hair either side of it to the nearer one.
    for (uint32_t lo = 0; lo < 0x7FFF; ++lo) {
      const double a = f.to_double(uint16_t(lo)), b = f.to_double(uint16_t(lo + 1));
      if (!std::isfinite(b)) break;
      const double mid = 0.5 * (a + b), hair = (b - a) * 1e-6;
      const uint16_t even = (lo % 2 == 0) ? uint16_t(lo) : uint16_t(lo + 1);
      if (f.from_double(mid) != even || f.from_double(-mid) != (even | 0x8000) || f.from_double(mid - hair) != lo ||
          f.from_double(mid + hair) != lo + 1)
        FAIL_CHECK("between patterns " << lo << " and " << lo + 1);
    }
    const uint16_t largest = f.mantissa_bits == 10 ? 0x7BFF : 0x7F7F;
    const double max = f.to_double(largest), ulp = max - f.to_double(uint16_t(largest - 1));
    CHECK(f.from_double(max + 0.49 * ulp) == largest);
    CHECK(std::isinf(f.to_double(f.from_double(max + 0.5 * ulp))));
    CHECK(std::isinf(f.to_double(f.from_double(1e300))));
    CHECK(f.from_double(1e-300) == 0);
    CHECK(f.from_double(-0.0) == 0x8000);
  }
}
