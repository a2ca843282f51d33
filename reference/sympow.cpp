// The feature map phi in the three layouts of docs/spec.md, and the sympow_expand operation.
#include "reference/sympow.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "reference/common.hpp"
#include "reference/ops.hpp"

namespace expanse_ref {
namespace {

double factorial(int n) {
  double f = 1.0;
  for (int i = 2; i <= n; ++i) f *= i;
  return f;
}

// C(n, k) exactly for the small k used here (each partial product is an integer).
int64_t binomial(int64_t n, int64_t k) {
  int64_t r = 1;
  for (int64_t i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
}

int64_t int_pow(int64_t base, int p) {
  int64_t r = 1;
  for (int i = 0; i < p; ++i) r *= base;
  return r;
}

// Advance a non-decreasing multi-index idx (values in [0, n)) to the next one in lexicographic
// order; false after the last one (n-1, ..., n-1).
bool next_nondecreasing(std::vector<int64_t>& idx, int64_t n) {
  for (int k = static_cast<int>(idx.size()) - 1; k >= 0; --k) {
    if (idx[k] < n - 1) {
      ++idx[k];
      for (size_t f = k + 1; f < idx.size(); ++f) idx[f] = idx[k];
      return true;
    }
  }
  return false;
}

// Advance an unrestricted multi-index (values in [0, n)) in row-major order (the last index
// fastest); false after the last one.
bool next_row_major(std::vector<int64_t>& idx, int64_t n) {
  for (int k = static_cast<int>(idx.size()) - 1; k >= 0; --k) {
    if (++idx[k] < n) return true;
    idx[k] = 0;
  }
  return false;
}

// sqrt(p! / prod_k hist_k!), hist_k = how often value k occurs in the (sorted) multi-index.
double multinomial_sqrt(const std::vector<int64_t>& sorted_idx) {
  const int p = static_cast<int>(sorted_idx.size());
  double denom = 1.0;
  int run = 1;
  for (int f = 1; f <= p; ++f) {
    if (f < p && sorted_idx[f] == sorted_idx[f - 1]) {
      ++run;
    } else {
      denom *= factorial(run);
      run = 1;
    }
  }
  return std::sqrt(factorial(p) / denom);
}

}  // namespace

int64_t expanded_dim(int p, int64_t d, expanse_layout layout) {
  switch (layout.kind) {
    case EXPANSE_LAYOUT_SYMPOW: return binomial(d + (p - 1), p);  // (d + p) - 1 could overflow
    case EXPANSE_LAYOUT_TILED:
      if (layout.d_tile < 1 || d % layout.d_tile != 0)
        throw std::logic_error("reference: tiled layout needs d % d_tile == 0");
      return binomial(d / layout.d_tile + (p - 1), p) * int_pow(layout.d_tile, p);
    case EXPANSE_LAYOUT_TENSOR: return int_pow(d, p);
    default: throw std::logic_error("reference: unknown layout kind " + std::to_string(layout.kind));
  }
}

FeatureMap::FeatureMap(int p, int64_t d, expanse_layout layout) : p_(p), d_(d) {
  if (p < 1 || d < 1) throw std::logic_error("reference: feature map needs p >= 1 and d >= 1");
  const int64_t D = expanded_dim(p, d, layout);
  index_.reserve(static_cast<size_t>(D * p));
  coefficient_.reserve(static_cast<size_t>(D));
  std::vector<int64_t> idx(p, 0);

  switch (layout.kind) {
    case EXPANSE_LAYOUT_SYMPOW:
      // One entry per non-decreasing i1 <= ... <= ip, lexicographic, sqrt(p!/prod hist!) * x_i1..x_ip.
      do {
        for (int f = 0; f < p; ++f) index_.push_back(static_cast<int32_t>(idx[f]));
        coefficient_.push_back(multinomial_sqrt(idx));
      } while (next_nondecreasing(idx, d));
      break;

    case EXPANSE_LAYOUT_TILED: {
      // One block per non-decreasing tile multi-index a1 <= ... <= ap (lexicographic); the block is
      // the full tensor product x[a1] (x) ... (x) x[ap], row-major over the local indices, times
      // sqrt(p!/prod hist!) of the tile multi-index.
      const int64_t dt = layout.d_tile;
      std::vector<int64_t> tiles(p, 0);
      do {
        const double coef = multinomial_sqrt(tiles);
        std::vector<int64_t> local(p, 0);
        do {
          for (int f = 0; f < p; ++f) index_.push_back(static_cast<int32_t>(tiles[f] * dt + local[f]));
          coefficient_.push_back(coef);
        } while (next_row_major(local, dt));
      } while (next_nondecreasing(tiles, d / dt));
      break;
    }

    case EXPANSE_LAYOUT_TENSOR:
      // All d^p products x_i1 * ... * x_ip, row-major, coefficient 1.
      do {
        for (int f = 0; f < p; ++f) index_.push_back(static_cast<int32_t>(idx[f]));
        coefficient_.push_back(1.0);
      } while (next_row_major(idx, d));
      break;

    default: throw std::logic_error("reference: unknown layout kind " + std::to_string(layout.kind));
  }
  if (static_cast<int64_t>(coefficient_.size()) != D)
    throw std::logic_error("reference: feature map size does not match the SPEC formula for D");
}

void FeatureMap::expand(const double* x, double* out) const {
  const int32_t* idx = index_.data();
  const int64_t D = this->D();
  for (int64_t a = 0; a < D; ++a, idx += p_) {
    double v = coefficient_[a];
    for (int f = 0; f < p_; ++f) v *= x[idx[f]];
    out[a] = v;
  }
}

RowMatrix FeatureMap::expand_rows(const RowMatrix& X) const {
  if (X.cols() != d_) throw std::logic_error("reference: expand_rows got the wrong head dim");
  RowMatrix out(X.rows(), D());
  for (int64_t i = 0; i < X.rows(); ++i) expand(X.row(i).data(), out.row(i).data());
  return out;
}

Vector FeatureMap::expand_vector(const Vector& x) const {
  if (x.size() != d_) throw std::logic_error("reference: expand_vector got the wrong head dim");
  Vector out(D());
  expand(x.data(), out.data());
  return out;
}

void FeatureMap::pullback(const double* x, const double* dphi, double* dx) const {
  for (int64_t i = 0; i < d_; ++i) dx[i] = 0.0;
  const int32_t* idx = index_.data();
  const int64_t D = this->D();
  for (int64_t a = 0; a < D; ++a, idx += p_) {
    const double w = dphi[a] * coefficient_[a];
    if (w == 0.0) continue;
    for (int f = 0; f < p_; ++f) {
      double others = w;
      for (int g = 0; g < p_; ++g)
        if (g != f) others *= x[idx[g]];
      dx[idx[f]] += others;
    }
  }
}

RowMatrix FeatureMap::pullback_rows(const RowMatrix& X, const RowMatrix& dPhi) const {
  if (X.cols() != d_ || dPhi.cols() != D() || X.rows() != dPhi.rows())
    throw std::logic_error("reference: pullback_rows got mismatched shapes");
  RowMatrix out(X.rows(), d_);
  for (int64_t i = 0; i < X.rows(); ++i) pullback(X.row(i).data(), dPhi.row(i).data(), out.row(i).data());
  return out;
}

// ------------------------------------------------------------------ operation sympow_expand

// x [..., d] -> out [..., D]. problem.rows vectors; the leading multi-index is walked with each
// tensor's own strides.
void sympow_expand(const expanse_problem& pb, const expanse_sympow_expand_args& args) {
  const expanse_tensor& x = *args.x;
  const expanse_tensor& out = *args.out;
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: sympow_expand D mismatch");
  const int lead = x.ndim - 1;  // number of leading dims

  parallel_for_index(pb.rows, [&](int64_t row) {
    // Unravel the row number into the leading multi-index (row-major), accumulating offsets.
    int64_t rest = row, x_off = 0, out_off = 0;
    for (int dim = lead - 1; dim >= 0; --dim) {
      const int64_t i = rest % x.shape[dim];
      rest /= x.shape[dim];
      x_off += i * x.strides[dim];
      out_off += i * out.strides[dim];
    }
    const Vector xv = gather_vector(x, x_off, pb.d, x.strides[lead]);
    scatter_vector(out, out_off, out.strides[lead], phi.expand_vector(xv));
  });
}

}  // namespace expanse_ref
