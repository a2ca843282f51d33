// Small helpers shared by the reference operations.
#ifndef EXPANSE_REFERENCE_COMMON_HPP
#define EXPANSE_REFERENCE_COMMON_HPP

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "expanse/backend.h"
#include "reference/strided.hpp"

namespace expanse_ref {

// f(i) for i in [0, n), in parallel. Each i is one independent task (a batch x head pair, a chunk,
// ...), so the grain is 1.
template <class F>
void parallel_for_index(int64_t n, const F& f) {
  if (n <= 0) return;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i != r.end(); ++i) f(i);
  });
}

// x^p for an integer p >= 0 by repeated multiplication (keeps the sign of x for odd p).
inline double ipow(double x, int p) {
  double r = 1.0;
  for (int i = 0; i < p; ++i) r *= x;
  return r;
}

// Grouped-query attention: query head i reads kv head i / (hq / h).
inline int64_t kv_head_of(const expanse_problem& pb, int64_t query_head) {
  return query_head / (pb.hq / pb.h);
}

// Inclusive prefix sums G_i = x_0 + ... + x_i of log gates, for the decays exp(G_i - G_j) (the
// product of the gates j+1 .. i).
//  * Each sum is kept as an unevaluated sum hi_i + lo_i (hi is the ordinary running sum, lo collects
//    its exact rounding errors via TwoSum). This makes the gate differences G_i - G_j accurate to a
//    few ulps of the *difference*, even when |G| is large (long sequences) and i, j are close, which
//    is where exp(G_i - G_j) matters. (Needs IEEE arithmetic: the library is not built with
//    -ffast-math.)
//  * x_r = -inf is a reset (docs/spec.md): every decay across it is exactly 0, and the ones after it
//    are sums from r + 1 on. So the running sum restarts at each reset, and a difference G_i - G_j is
//    -inf when a reset lies in (j, i], else the difference of the restarted sums (never -inf - -inf).
class PrefixSum {
 public:
  explicit PrefixSum(const Vector& x) : hi_(x.size()), lo_(x.size()), last_reset_(x.size()) {
    double hi = 0.0, lo = 0.0;
    int64_t last_reset = -1;  // none yet
    for (int64_t i = 0; i < x.size(); ++i) {
      if (x(i) == -std::numeric_limits<double>::infinity()) {
        hi = lo = 0.0;
        last_reset = i;
      } else {
        const double s = hi + x(i);
        const double bb = s - hi;
        lo += (hi - (s - bb)) + (x(i) - bb);  // TwoSum: exact error of hi + x(i)
        hi = s;
      }
      hi_[i] = hi;
      lo_[i] = lo;
      last_reset_[i] = last_reset;
    }
  }
  int64_t size() const { return static_cast<int64_t>(hi_.size()); }
  // G_i (-inf from the first reset on).
  double at(int64_t i) const {
    return last_reset_[i] >= 0 ? -std::numeric_limits<double>::infinity() : hi_[i] + lo_[i];
  }
  // G_i - G_j for j <= i.
  double diff(int64_t i, int64_t j) const {
    if (last_reset_[i] > j) return -std::numeric_limits<double>::infinity();
    return (hi_[i] - hi_[j]) + (lo_[i] - lo_[j]);
  }
  // The total G_{n-1} (0 for an empty sequence).
  double total() const { return hi_.empty() ? 0.0 : at(size() - 1); }
  // G_last - G_j: the decay from token j to the end of the range.
  double to_end(int64_t j) const { return diff(size() - 1, j); }

 private:
  std::vector<double> hi_, lo_;
  std::vector<int64_t> last_reset_;  // the last reset at or before i, -1 for none
};

// Normalized output: o_i = num_i / den_i, and o_i = 0 where den_i is exactly 0 (docs/spec.md).
inline void divide_rows(RowMatrix& num, const Vector& den) {
  for (int64_t i = 0; i < num.rows(); ++i) {
    if (den(i) == 0.0)
      num.row(i).setZero();
    else
      num.row(i) /= den(i);
  }
}

// Query rows are processed in blocks of this many rows where a [rows x keys] score matrix is
// formed, so memory stays bounded for long sequences.
constexpr int64_t kRowBlock = 256;

// The chunk size c of a chunked op: problem.c, or the whole sequence when it is 0 (the quadratic
// form, where the core sets c = t anyway).
inline int64_t chunk_size_of(const expanse_problem& pb) { return pb.c > 0 ? pb.c : pb.t; }

// [first, first + len) tokens of chunk m with chunk size c over t tokens (the last chunk may be
// shorter).
struct ChunkRange {
  int64_t first, len;
};
inline ChunkRange chunk_range(int64_t m, int64_t c, int64_t t) {
  const int64_t first = m * c;
  return {first, std::max<int64_t>(0, std::min(c, t - first))};
}

}  // namespace expanse_ref

#endif  // EXPANSE_REFERENCE_COMMON_HPP
