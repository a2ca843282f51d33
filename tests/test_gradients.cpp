// The gradients of the reference (docs/spec.md "Gradients") against central finite differences of
// its own forward, in f64, on small random problems covering every input and option: each element
// of each gradient against central differences (L(x + h) - L(x - h)) / 2h, extrapolated, where
// L = sum dout . o + <dfinal_S, final_S> + <dfinal_z, final_z>. (The case table checks the same
// gradients against the naive oracle's token-by-token reverse mode.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cases.hpp"
#include "test_seed.hpp"

namespace h = expanse::harness;

namespace {

// The forward of a backward config.
h::op_config forward_of(h::op_config cfg) {
  const std::string name = expanse_op_name(cfg.op);
  expanse::check(expanse_op_from_name(name.substr(0, name.rfind("_backward")).c_str(), &cfg.op));
  return cfg;
}

// The terms of L = sum over the forward's outputs of <cotangent, output> (d<name>, dout for o), one per
// output element. chunk_attention's rowmax is held at the backward's: y and l count as
// exp(rowmax - rowmax_given) y, likewise l.
std::vector<double> loss_terms(expanse::context& ctx, const h::op_config& backward, h::tensor_map inputs) {
  const h::tensor_map given = inputs;
  inputs.erase("o");
  const h::tensor_map out = h::run_on(ctx, forward_of(backward), inputs, /*oracle=*/true);
  const bool fixed_rowmax = out.count("rowmax") && given.count("rowmax");
  std::vector<double> terms;
  for (const auto& [name, y] : out) {
    const std::string cotangent = name == "o" ? "dout" : "d" + name;
    if (!given.count(cotangent)) continue;
    const h::host_tensor& w = given.at(cotangent);
    REQUIRE(y.numel() == w.numel());
    const int64_t per_row = fixed_rowmax ? y.numel() / out.at("rowmax").numel() : 1;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double rescale =
          fixed_rowmax ? std::exp(out.at("rowmax").get(i / per_row) - given.at("rowmax").get(i / per_row)) : 1.0;
      terms.push_back(y.get(i) * rescale * w.get(i));
    }
  }
  return terms;
}

// ||a - b|| / ||b|| (absolute when b is 0).
double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// dL/dx from central differences D(h) = dL/dx + c1 h^2 + c2 h^4 + ... by Ridders' method: a Neville
// tableau of Richardson extrapolations over the steps h0, h0/2, h0/4, ..., returning the entry whose
// neighbours agree best. One fixed step cannot serve every input: where a denominator is small the
// h^4 terms of h = 1e-3 reach 1e-6 relative, while at h = 1e-4 the rounding of L over 2h reaches 1e-8.
template <class Central>
double extrapolated_derivative(Central&& central, double h0) {
  constexpr int kLevels = 8;
  double table[kLevels][kLevels];
  double best = table[0][0] = central(h0), best_error = std::numeric_limits<double>::infinity();
  double h = h0;
  for (int i = 1; i < kLevels; ++i) {
    h /= 2;
    table[0][i] = central(h);
    double factor = 4;
    for (int j = 1; j <= i; ++j, factor *= 4) {  // cancel the h^(2j) term
      table[j][i] = (factor * table[j - 1][i] - table[j - 1][i - 1]) / (factor - 1);
      const double error =
          std::max(std::abs(table[j][i] - table[j - 1][i]), std::abs(table[j][i] - table[j - 1][i - 1]));
      if (error <= best_error) best_error = error, best = table[j][i];
    }
    // Rounding has taken over once the newest extrapolation moves away from the previous one.
    if (std::abs(table[i][i] - table[i - 1][i - 1]) >= 2 * best_error) break;
  }
  return best;
}

void check_against_finite_differences(const h::op_config& cfg, uint64_t seed) {
  expanse::context ctx("reference");
  h::tensor_map inputs = h::make_inputs(cfg, seed);
  if (inputs.count("z") && inputs.count("o")) {
    // query_state: the consistent states leave z_0 = 0, so the first tokens' denominators are single
    // tiny (q . k)^2 terms, where o is too ill-conditioned for differences. A state before the
    // sequence (z + 1, o recomputed) keeps every denominator away from 0.
    h::host_tensor& z = inputs.at("z");
    for (int64_t i = 0; i < z.numel(); ++i) z.set(i, z.get(i) + 1.0);
    h::tensor_map forward_inputs = inputs;
    forward_inputs.erase("o");
    inputs.at("o") = h::run_on(ctx, forward_of(cfg), forward_inputs, /*oracle=*/true).at("o");
  }
  const h::tensor_map grads = h::run_on(ctx, cfg, inputs, /*oracle=*/true);
  int checked = 0;
  for (const auto& [input, value] : inputs) {  // every input that has a gradient
    const std::string name = input;
    if (!grads.count("d" + name)) continue;
    const h::host_tensor& grad = grads.at("d" + name);
    std::vector<double> analytic, numeric;
    for (int64_t i = 0; i < value.numel(); ++i) {
      const double x = value.get(i);
      if (x == -std::numeric_limits<double>::infinity()) {  // a reset: its gradient is exactly 0
        CHECK_MESSAGE(grad.get(i) == 0.0, name, "[", i, "] at a reset, seed ", seed);
        continue;
      }
      h::tensor_map moved = inputs;
      // (L(x + h) - L(x - h)) / 2h = dL/dx + c h^2 + O(h^4), differenced term by term before the
      // sum: L itself reached 2e3 on a case whose gradient entries are 1e-1, and the rounding of its
      // sum, over 2h, put the differences 1e-9 off (1.00021e-8 relative, over the 1e-8 bound).
      auto central = [&](double hstep) {
        moved.at(name).set(i, x + hstep);
        const std::vector<double> up = loss_terms(ctx, cfg, moved);
        moved.at(name).set(i, x - hstep);
        const std::vector<double> down = loss_terms(ctx, cfg, moved);
        double difference = 0;
        for (size_t j = 0; j < up.size(); ++j) difference += up[j] - down[j];
        return difference / (2 * hstep);
      };
      numeric.push_back(extrapolated_derivative(central, 2e-3));
      analytic.push_back(grad.get(i));
    }
    const double err = rel_error(analytic, numeric);
    INFO(cfg.label(), " d", name, " seed ", seed);
    CHECK(err <= 1e-8);
    ++checked;
  }
  CHECK(checked >= 2);
}

h::op_config small(int32_t p, int64_t chunk) {
  h::op_config c;
  c.op = expanse::ops::power_attention_backward;
  c.dtype = EXPANSE_F64;
  c.b = 1; c.t = 9; c.hq = 4; c.h = 2; c.d = 4; c.e = 3; c.p = p; c.c = chunk;
  c.normalize = p % 2 == 0;
  c.initial_state = c.final_state = true;
  return c;
}

}  // namespace

TEST_CASE("power_attention_backward: the reference's gradients are the finite differences of its forward") {
  const uint64_t seed = test_seed();
  for (int32_t p = 1; p <= 4; ++p)
    for (int64_t chunk : {0, 4}) check_against_finite_differences(small(p, chunk), seed + uint64_t(p));
  h::op_config c = small(2, 4);
  c.normalize = false;  // even p, unnormalized
  check_against_finite_differences(c, seed);
  c.gated = false;  // no gates, no states
  c.initial_state = c.final_state = false;
  check_against_finite_differences(c, seed);
  c = small(2, 2);
  c.t = 1;  // one token, one ragged chunk
  check_against_finite_differences(c, seed);
  c = small(2, 4);
  c.hq = c.h = 2;  // no grouped heads
  c.layout = {EXPANSE_LAYOUT_TILED, 2};
  c.scale = 0.7;
  check_against_finite_differences(c, seed);
  c = small(2, 4);
  c.resets = true;  // gates of exactly 0
  c.t = 13;
  for (bool normalize : {false, true}) {
    c.normalize = normalize;
    check_against_finite_differences(c, seed + 7);
  }
}

TEST_CASE("core operations' backwards: the reference's gradients are the finite differences of its forwards") {
  const uint64_t seed = test_seed();
  h::op_config c;
  c.dtype = EXPANSE_F64;
  c.b = 1; c.t = 11; c.hq = 4; c.h = 2; c.d = 3; c.e = 2; c.c = 4;
  c.op = expanse::ops::update_state_backward;
  for (int32_t p : {1, 2, 3}) {
    c.p = p;
    check_against_finite_differences(c, seed + uint64_t(p));
  }
  c.p = 2;
  c.resets = true;
  check_against_finite_differences(c, seed);
  c.resets = false;
  c.op = expanse::ops::discumsum_backward;
  for (bool initial : {false, true}) {
    c.initial_state = initial;
    check_against_finite_differences(c, seed);
  }
  c.initial_state = false;
  c.op = expanse::ops::query_state_backward;
  for (bool intra : {false, true})
    for (bool normalize : {false, true}) {
      c.intra = intra;
      c.normalize = normalize;
      c.gated = intra || !normalize;  // normalized without intra: o does not depend on the gates
      check_against_finite_differences(c, seed);
    }
  c.intra = false;
  c.gated = true;
  c.op = expanse::ops::chunk_attention_backward;
  for (int64_t chunk : {0, 4})
    for (int32_t p : {2, 3}) {
      c.c = chunk;
      c.p = p;
      check_against_finite_differences(c, seed + uint64_t(p));
    }
  c.resets = true;
  check_against_finite_differences(c, seed);
}

namespace {

// Slots [first, first + count) of dimension 1 of a [b, N, ...] tensor.
h::host_tensor slots(const h::host_tensor& x, int64_t first, int64_t count) {
  std::vector<int64_t> shape = x.shape;
  int64_t inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  const int64_t N = shape[1];
  shape[1] = count;
  h::host_tensor out = h::host_tensor::zeros(x.dtype, shape);
  for (int64_t bi = 0; bi < shape[0]; ++bi)
    for (int64_t m = 0; m < count; ++m)
      for (int64_t i = 0; i < inner; ++i) out.set((bi * count + m) * inner + i, x.get((bi * N + first + m) * inner + i));
  return out;
}

// [b, n, ...] and [b, ...] -> [b, n + 1, ...]: `last` appended along dimension 1.
h::host_tensor append_slot(const h::host_tensor& x, const h::host_tensor& last) {
  std::vector<int64_t> shape = x.shape;
  int64_t inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  const int64_t n = shape[1];
  shape[1] = n + 1;
  h::host_tensor out = h::host_tensor::zeros(x.dtype, shape);
  for (int64_t bi = 0; bi < shape[0]; ++bi)
    for (int64_t m = 0; m <= n; ++m)
      for (int64_t i = 0; i < inner; ++i)
        out.set((bi * (n + 1) + m) * inner + i, m < n ? x.get((bi * n + m) * inner + i) : last.get(bi * inner + i));
  return out;
}

h::tensor_map run_ref(expanse::context& ctx, h::op_config cfg, expanse_op_kind op, const h::tensor_map& in) {
  cfg.op = op;
  return h::run_on(ctx, cfg, in, /*oracle=*/true);
}

}  // namespace

TEST_CASE("power_attention_backward is the composition of the core operations' backwards") {
  // docs/spec.md's chunked form, run through the public operations: the forward states by update_state
  // and discumsum, then query_state_backward (dq's state term, each chunk's state cotangent),
  // chunk_attention_backward (the pairs), discumsum_backward (the reverse scan: dX_m is the cotangent
  // chunk m's keys see, dA_m the gates' share through the chunk totals, dY_init the initial state's
  // gradient) and update_state_backward; dlog_g is the sum of the four parts.
  expanse::context ctx("reference");
  h::op_config cfg;
  cfg.op = expanse::ops::power_attention_backward;
  cfg.dtype = EXPANSE_F64;
  cfg.b = 2; cfg.t = 23; cfg.hq = 4; cfg.h = 2; cfg.d = 4; cfg.e = 3; cfg.c = 5; cfg.p = 2;
  cfg.initial_state = cfg.final_state = true;
  const uint64_t seed = test_seed();
  const h::tensor_map in = h::make_inputs(cfg, seed);
  const h::tensor_map whole = h::run_on(ctx, cfg, in, /*oracle=*/true);
  const int64_t n = h::chunk_count(cfg.t, cfg.c);

  // The forward's pieces.
  const h::tensor_map local = run_ref(ctx, cfg, expanse::ops::update_state, in);
  h::host_tensor A = h::host_tensor::zeros(EXPANSE_F64, {cfg.b, n, cfg.h});  // the chunk totals of log_g
  for (int64_t bi = 0; bi < cfg.b; ++bi)
    for (int64_t j = 0; j < cfg.t; ++j)
      for (int64_t hi = 0; hi < cfg.h; ++hi) {
        const int64_t at = (bi * n + j / cfg.c) * cfg.h + hi;
        A.set(at, A.get(at) + in.at("log_g").get((bi * cfg.t + j) * cfg.h + hi));
      }
  // discumsum over [D, e] states (z as [D, 1]): the harness reads its trailing dims as [d, e].
  const int64_t D = expanse::expanded_dim(cfg.p, cfg.d, cfg.layout);
  auto with_shape = [](h::host_tensor x, std::vector<int64_t> shape) {
    x.shape = std::move(shape);
    return x;
  };
  auto states_cfg = [&](bool is_z) {
    h::op_config c = cfg;
    c.d = D;
    c.e = is_z ? 1 : cfg.e;
    return c;
  };
  auto as_states = [&](const h::host_tensor& x, bool is_z) {  // [b, N, h, D] -> [b, N, h, D, 1] for z
    std::vector<int64_t> shape = x.shape;
    if (is_z) shape.push_back(1);
    return with_shape(x, shape);
  };
  auto scan = [&](const char* X, const char* init, bool is_z) {
    const h::host_tensor Y = run_ref(ctx, states_cfg(is_z), expanse::ops::discumsum,
                                     {{"X", as_states(local.at(X), is_z)}, {"A", A}, {"Y_init", as_states(in.at(init), is_z)}})
                                 .at("Y");
    std::vector<int64_t> shape = Y.shape;
    if (is_z) shape.pop_back();
    return with_shape(Y, shape);
  };
  const h::host_tensor S_all = scan("S", "initial_S", false), z_all = scan("z", "initial_z", true);
  h::tensor_map qin = in;
  qin["S"] = slots(S_all, 0, n);
  qin["z"] = slots(z_all, 0, n);
  const h::tensor_map intra = run_ref(ctx, cfg, expanse::ops::chunk_attention, in);
  for (const char* name : {"y", "l", "rowmax"}) qin[name] = intra.at(name);
  h::op_config qcfg = cfg;
  qcfg.intra = true;

  // The backwards.
  qcfg.op = expanse::ops::query_state_backward;
  const h::tensor_map dquery = h::run_on(ctx, qcfg, qin, true);
  const h::tensor_map dpairs =
      run_ref(ctx, cfg, expanse::ops::chunk_attention_backward, {{"q", in.at("q")}, {"k", in.at("k")}, {"v", in.at("v")},
              {"log_g", in.at("log_g")}, {"rowmax", intra.at("rowmax")}, {"dy", dquery.at("dy")}, {"dl", dquery.at("dl")}});
  auto reverse_scan = [&](const char* X, const char* init, const char* dlocal, const char* dfinal, bool is_z) {
    h::tensor_map r = run_ref(ctx, states_cfg(is_z), expanse::ops::discumsum_backward,
                              {{"X", as_states(local.at(X), is_z)}, {"A", A}, {"Y_init", as_states(in.at(init), is_z)},
                               {"dY", as_states(append_slot(dquery.at(dlocal), in.at(dfinal)), is_z)}});
    for (const char* name : {"dX", "dY_init"}) {
      std::vector<int64_t> shape = r.at(name).shape;
      if (is_z) shape.pop_back();
      r.at(name) = with_shape(r.at(name), shape);
    }
    return r;
  };
  const h::tensor_map dscan_S = reverse_scan("S", "initial_S", "dS", "dfinal_S", false);
  const h::tensor_map dscan_z = reverse_scan("z", "initial_z", "dz", "dfinal_z", true);
  const h::tensor_map dkeys = run_ref(ctx, cfg, expanse::ops::update_state_backward,
                                      {{"k", in.at("k")}, {"v", in.at("v")}, {"log_g", in.at("log_g")},
                                       {"dS", dscan_S.at("dX")}, {"dz", dscan_z.at("dX")}});

  auto sum = [](std::initializer_list<const h::host_tensor*> parts) {
    h::host_tensor out = **parts.begin();
    for (auto it = parts.begin() + 1; it != parts.end(); ++it)
      for (int64_t i = 0; i < out.numel(); ++i) out.set(i, out.get(i) + (*it)->get(i));
    return out;
  };
  h::host_tensor dA_tokens = h::host_tensor::zeros(EXPANSE_F64, {cfg.b, cfg.t, cfg.h});  // A_m holds each log_g of m
  for (int64_t bi = 0; bi < cfg.b; ++bi)
    for (int64_t j = 0; j < cfg.t; ++j)
      for (int64_t hi = 0; hi < cfg.h; ++hi) {
        const int64_t at = (bi * n + j / cfg.c) * cfg.h + hi;
        dA_tokens.set((bi * cfg.t + j) * cfg.h + hi, dscan_S.at("dA").get(at) + dscan_z.at("dA").get(at));
      }
  const h::tensor_map composed = {
      {"dq", sum({&dquery.at("dq"), &dpairs.at("dq")})},
      {"dk", sum({&dpairs.at("dk"), &dkeys.at("dk")})},
      {"dv", sum({&dpairs.at("dv"), &dkeys.at("dv")})},
      {"dlog_g", sum({&dquery.at("dlog_g"), &dpairs.at("dlog_g"), &dkeys.at("dlog_g"), &dA_tokens})},
      {"dinitial_S", dscan_S.at("dY_init")},
      {"dinitial_z", dscan_z.at("dY_init")}};
  for (const h::comparison& c : h::compare(composed, whole, 1e-12)) {
    INFO(c.output, " rel. error ", c.rel_error, " seed ", seed);
    CHECK(c.pass);
  }
}
