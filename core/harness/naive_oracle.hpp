// An independent, deliberately naive f64 implementation of every operation of docs/spec.md, written
// from the formulas with plain loops and no code shared with the reference backend. It is the
// oracle for the reference itself (the reference is the oracle for every other backend).
#pragma once

#include "cases.hpp"

namespace expanse::harness::naive {

// phi(x) for one vector of length d in `layout` (docs/spec.md), length D.
std::vector<double> phi(const std::vector<double>& x, int32_t p, expanse_layout layout);

// Computes the outputs of cfg (names and shapes as in cases.hpp) in f64 from the inputs (any dtype,
// read as f64). Tokens are processed one at a time in the recurrent form where states are involved.
tensor_map run(const op_config& cfg, const tensor_map& inputs);

}  // namespace expanse::harness::naive
