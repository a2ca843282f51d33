// Fresh random inputs per run: the seed comes from $EXPANSE_TEST_SEED when set (to rerun a failure),
// otherwise from the system, and every failing check prints it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("EXPANSE_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(s, nullptr, 10));
    return static_cast<uint64_t>(std::random_device{}() & 0x7fffffff);
  }();
  return seed;
}
