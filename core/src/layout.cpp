#include "layout.hpp"

#include "errors.hpp"

namespace expanse::detail {

int64_t binomial_checked(int64_t n, int64_t k) {
  if (k < 0 || n < k) return 0;
  if (k > n - k) k = n - k;
  // r = C(n-k+i, i) for i = 1..k, each step exact because C(m, i) * (m+1) / (i) stays integral.
  __int128 r = 1;
  for (int64_t i = 1; i <= k; ++i) {
    r = r * (n - k + i) / i;
    if (r > INT64_MAX) return -1;
  }
  return static_cast<int64_t>(r);
}

static int64_t power_checked(int64_t base, int32_t p) {
  if (base <= 1) return base;  // also keeps a huge p from looping
  __int128 r = 1;
  for (int32_t i = 0; i < p; ++i) {
    r *= base;
    if (r > INT64_MAX) return -1;
  }
  return static_cast<int64_t>(r);
}

// C(n + p - 1, p), the number of multisets of size p from n things; -1 on overflow.
static int64_t multisets_checked(int64_t n, int32_t p) {
  return n > INT64_MAX - (p - 1) ? -1 : binomial_checked(n + (p - 1), p);
}

int64_t expanded_dim_checked(int32_t p, int64_t d, expanse_layout layout) {
  switch (layout.kind) {
    case EXPANSE_LAYOUT_SYMPOW: return multisets_checked(d, p);
    case EXPANSE_LAYOUT_TENSOR: return power_checked(d, p);
    case EXPANSE_LAYOUT_TILED: {
      const int64_t blocks = multisets_checked(d / layout.d_tile, p);
      const int64_t block = power_checked(layout.d_tile, p);
      if (blocks < 0 || block < 0) return -1;
      __int128 r = static_cast<__int128>(blocks) * block;
      return r > INT64_MAX ? -1 : static_cast<int64_t>(r);
    }
    default: return -1;
  }
}

const char* layout_name(int32_t kind) {
  switch (kind) {
    case EXPANSE_LAYOUT_SYMPOW: return "sympow";
    case EXPANSE_LAYOUT_TILED: return "tiled";
    case EXPANSE_LAYOUT_TENSOR: return "tensor";
    default: return "unknown";
  }
}

}  // namespace expanse::detail

using namespace expanse::detail;

extern "C" EXPANSE_API expanse_status expanse_expanded_dim(int32_t p, int64_t d, expanse_layout layout,
                                                           int64_t* D) {
  return guarded([&] {
    if (!D) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_expanded_dim: argument 'D' is NULL");
    if (p < 1) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_expanded_dim: p must be >= 1, got %d", p);
    if (d < 1) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_expanded_dim: d must be >= 1, got %lld", (long long)d);
    if (layout.kind < EXPANSE_LAYOUT_SYMPOW || layout.kind > EXPANSE_LAYOUT_TENSOR)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_expanded_dim: unknown layout kind %d", layout.kind);
    if (layout.kind == EXPANSE_LAYOUT_TILED && (layout.d_tile < 1 || d % layout.d_tile != 0))
      fail(EXPANSE_ERROR_INVALID_ARGUMENT,
           "expanse_expanded_dim: tiled layout needs d %% d_tile == 0 with d_tile >= 1; got d=%lld, d_tile=%d",
           (long long)d, layout.d_tile);
    const int64_t r = expanded_dim_checked(p, d, layout);
    if (r < 0) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_expanded_dim: D overflows int64 for p=%d, d=%lld", p, (long long)d);
    *D = r;
  });
}
