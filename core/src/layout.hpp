// Sizes of the feature map phi (docs/spec.md "The feature map phi"), with overflow checks.
#pragma once

#include <cstdint>

#include "expanse/expanse.h"

namespace expanse::detail {

// C(n, k) exactly, or -1 when it does not fit in int64.
int64_t binomial_checked(int64_t n, int64_t k);
// D for degree p, head dim d and a layout; -1 on overflow. Layout and d % d_tile must be valid.
int64_t expanded_dim_checked(int32_t p, int64_t d, expanse_layout layout);
const char* layout_name(int32_t kind);

}  // namespace expanse::detail
