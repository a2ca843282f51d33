// <phi(q), phi(k)> = (q . k)^p for every layout and p (docs/spec.md "The feature map phi"), through the
// library's sympow_expand, plus the expanded dimensions docs/spec.md lists.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "expanse/expanse.hpp"
#include "test_seed.hpp"

TEST_CASE("expanded dimensions of docs/spec.md") {
  CHECK(expanse::expanded_dim(2, 64) == 2080);
  CHECK(expanse::expanded_dim(3, 64) == 45760);
  CHECK(expanse::expanded_dim(4, 64) == 766480);
  CHECK(expanse::expanded_dim(2, 64, {EXPANSE_LAYOUT_TILED, 8}) == 2304);
  CHECK(expanse::expanded_dim(3, 5, {EXPANSE_LAYOUT_TENSOR, 0}) == 125);
  CHECK(expanse::expanded_dim(1, 7, {EXPANSE_LAYOUT_TILED, 7}) == 7);
}

TEST_CASE("inner products of expanded vectors are powers of dot products") {
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<double> noise;
  expanse::context ctx("reference");
  const expanse_layout layouts[] = {{EXPANSE_LAYOUT_SYMPOW, 0}, {EXPANSE_LAYOUT_TENSOR, 0}, {EXPANSE_LAYOUT_TILED, 2},
                                    {EXPANSE_LAYOUT_TILED, 3}};
  for (int p = 1; p <= 6; ++p)
    for (expanse_layout layout : layouts) {
      const int64_t d = 6, D = expanse::expanded_dim(p, d, layout);
      std::vector<double> x(2 * d), phi(2 * D, NAN);
      for (double& xi : x) xi = noise(rng);
      expanse_tensor tx = expanse::tensor(x.data(), {2, d}), tphi = expanse::tensor(phi.data(), {2, D});
      auto a = expanse::sympow_expand_args();
      a.x = &tx; a.out = &tphi; a.p = p; a.layout = layout;
      ctx.sympow_expand(a);
      double dot = 0, abs_dot = 0, inner = 0;
      for (int64_t i = 0; i < d; ++i) dot += x[i] * x[d + i], abs_dot += std::fabs(x[i] * x[d + i]);
      for (int64_t i = 0; i < D; ++i) inner += phi[i] * phi[D + i];
      // A sum of D products of mixed sign is exact to rounding relative to the sum of their
      // magnitudes, (sum_i |x_i y_i|)^p, not to the result, which may be tiny when x and y are
      // nearly orthogonal. The forward error bound, with unit roundoff u: each phi entry carries
      // p + 1 roundings (p - 1 products, the coefficient's square root and its product), the
      // inner product D - 1 more, and pow(dot, p) p (d + 1) from dot's d roundings and pow's own.
      // DBL_EPSILON = 2u leaves a factor of two for the second-order terms.
      const double roundings = static_cast<double>(D) + 2.0 * (p + 1) + p * (d + 1);
      INFO("p=" << p << " layout=" << layout.kind << " d_tile=" << layout.d_tile << " seed=" << test_seed());
      CHECK(std::fabs(inner - std::pow(dot, p)) <= roundings * DBL_EPSILON * std::pow(abs_dot, p));
    }
}

TEST_CASE("p = 1 is the identity in every layout, and strided inputs work") {
  expanse::context ctx("reference");
  std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8}, out(4, NAN);
  // x viewed as the column pairs of a 2x4 matrix: shape [2,2], strides [4,1] (rows 0 and 1, first 2 cols)
  expanse_tensor tx = expanse::tensor(x.data(), {2, 2});
  tx.strides[0] = 4;
  expanse_tensor tout = expanse::tensor(out.data(), {2, 2});
  for (expanse_layout layout : {expanse_layout{EXPANSE_LAYOUT_SYMPOW, 0}, expanse_layout{EXPANSE_LAYOUT_TILED, 1},
                                expanse_layout{EXPANSE_LAYOUT_TENSOR, 0}}) {
    auto a = expanse::sympow_expand_args();
    a.x = &tx; a.out = &tout; a.p = 1; a.layout = layout;
    ctx.sympow_expand(a);
    CHECK(out == std::vector<double>{1, 2, 5, 6});
  }
}
