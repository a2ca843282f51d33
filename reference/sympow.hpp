// The feature map phi (docs/spec.md "The feature map phi"): <phi(q), phi(k)> = (q . k)^p.
//
// Every layout is described the same way, as a list of D entries; entry a of phi(x) is
//     phi(x)_a = coefficient[a] * x[index[a][0]] * ... * x[index[a][p-1]]
// so one generic loop expands a vector in any layout, and a newcomer can check the table against
// the SPEC definitions (see the builders in sympow.cpp).
#ifndef EXPANSE_REFERENCE_SYMPOW_HPP
#define EXPANSE_REFERENCE_SYMPOW_HPP

#include <cstdint>
#include <vector>

#include "expanse/backend.h"
#include "reference/strided.hpp"

namespace expanse_ref {

// D for degree p, head dim d and a layout, by the SPEC formulas (no overflow check: the core has
// validated the sizes).
int64_t expanded_dim(int p, int64_t d, expanse_layout layout);

class FeatureMap {
 public:
  FeatureMap(int p, int64_t d, expanse_layout layout);

  int p() const { return p_; }
  int64_t d() const { return d_; }
  int64_t D() const { return static_cast<int64_t>(coefficient_.size()); }
  // index(a, f): the coordinate of x used by factor f (0 <= f < p) of entry a.
  int32_t index(int64_t a, int f) const { return index_[a * p_ + f]; }
  double coefficient(int64_t a) const { return coefficient_[a]; }

  // out[0..D) = phi(x[0..d)).
  void expand(const double* x, double* out) const;
  // Row-wise: X [rows x d] -> phi(X) [rows x D].
  RowMatrix expand_rows(const RowMatrix& X) const;
  Vector expand_vector(const Vector& x) const;

  // The pullback of phi at x: dx[0..d) = J_phi(x)^T dphi[0..D), the gradient with respect to x of
  // <phi(x), dphi>. Each entry a adds dphi_a * coefficient * (the product of its other factors) to the
  // coordinate of each of its factors.
  void pullback(const double* x, const double* dphi, double* dx) const;
  // Row-wise: X [rows x d], dPhi [rows x D] -> [rows x d].
  RowMatrix pullback_rows(const RowMatrix& X, const RowMatrix& dPhi) const;

 private:
  int p_;
  int64_t d_;
  std::vector<int32_t> index_;       // D * p coordinates, entry-major
  std::vector<double> coefficient_;  // D coefficients
};

}  // namespace expanse_ref

#endif  // EXPANSE_REFERENCE_SYMPOW_HPP
