// Strided element access with dtype conversion for the reference backend.
//
// Every tensor the reference reads or writes goes through these helpers: an element is read as a
// double whatever its dtype (f16/bf16/f32/f64), and a double is written back rounded to nearest,
// ties to even, into the tensor's dtype. Strides are in elements (DLPack style) and arbitrary.
// The f16/bf16 codecs are done by bit manipulation directly from/to double (never through float,
// which would round twice), including subnormals, infinities and NaN.
#ifndef EXPANSE_REFERENCE_STRIDED_HPP
#define EXPANSE_REFERENCE_STRIDED_HPP

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <vector>

#include <Eigen/Dense>

#include "expanse/expanse.h"

namespace expanse_ref {

// Row-major dense matrix: M(i, j) is row i, column j, and rows are contiguous in memory.
using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXd;

// ------------------------------------------------------------------ small binary float codecs

// Round a non-negative double to the nearest integer, ties to even. Written out instead of
// std::nearbyint so that the result never depends on the floating-point environment.
inline double round_half_even(double q) {
  const double f = std::floor(q);
  const double frac = q - f;  // exact: q and f are close
  if (frac > 0.5) return f + 1.0;
  if (frac < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

// IEEE-754 style binary format with `ebits` exponent bits and `mbits` stored mantissa bits
// (f16: 5/10, bf16: 8/7). Decode: bits -> exact double value.
inline double decode_binary(uint32_t bits, int ebits, int mbits) {
  const uint32_t mant = bits & ((1u << mbits) - 1u);
  const uint32_t expo = (bits >> mbits) & ((1u << ebits) - 1u);
  const bool negative = ((bits >> (mbits + ebits)) & 1u) != 0;
  const int bias = (1 << (ebits - 1)) - 1;
  double value;
  if (expo == (1u << ebits) - 1u) {  // all-ones exponent: inf or nan
    value = mant == 0 ? HUGE_VAL : std::nan("");
  } else if (expo == 0) {  // zero or subnormal: mant * 2^(1 - bias - mbits)
    value = std::ldexp(static_cast<double>(mant), 1 - bias - mbits);
  } else {  // normal: (2^mbits + mant) * 2^(expo - bias - mbits)
    value = std::ldexp(static_cast<double>(mant + (1u << mbits)), static_cast<int>(expo) - bias - mbits);
  }
  return negative ? -value : value;
}

// Encode: double -> nearest representable value, ties to even; overflow gives inf, NaN stays NaN.
inline uint32_t encode_binary(double x, int ebits, int mbits) {
  const uint32_t sign = std::signbit(x) ? (1u << (ebits + mbits)) : 0u;
  const uint32_t inf_bits = ((1u << ebits) - 1u) << mbits;
  if (std::isnan(x)) return sign | inf_bits | (1u << (mbits - 1));  // quiet NaN
  const double a = std::fabs(x);
  if (a == 0.0) return sign;
  if (std::isinf(a)) return sign | inf_bits;
  const int bias = (1 << (ebits - 1)) - 1;
  const int emin = 1 - bias;  // exponent of the smallest normal number
  int e2;
  std::frexp(a, &e2);  // a = f * 2^e2 with f in [0.5, 1), so a in [2^(e2-1), 2^e2)
  const int E = std::max(e2 - 1, emin);  // subnormals share the spacing of the smallest binade
  // q = a in units of the last place of its binade: [2^mbits, 2^(mbits+1)) for normals,
  // [0, 2^mbits) for subnormals. Scaling by a power of two is exact.
  const double q = round_half_even(std::ldexp(a, mbits - E));
  // (E - emin) << mbits plus q gives the exponent field and mantissa at once, including the carry
  // when q rounds up to the next binade and the subnormal -> normal transition.
  const uint64_t magnitude = (static_cast<uint64_t>(E - emin) << mbits) + static_cast<uint64_t>(q);
  if (magnitude >= inf_bits) return sign | inf_bits;  // overflow rounds to infinity
  return sign | static_cast<uint32_t>(magnitude);
}

inline double f16_to_double(uint16_t h) { return decode_binary(h, 5, 10); }
inline double bf16_to_double(uint16_t h) { return decode_binary(h, 8, 7); }
inline uint16_t double_to_f16(double x) { return static_cast<uint16_t>(encode_binary(x, 5, 10)); }
inline uint16_t double_to_bf16(double x) { return static_cast<uint16_t>(encode_binary(x, 8, 7)); }

// ------------------------------------------------------------------ element access

// Offset in elements of the element at multi-index idx (one entry per dimension, in order).
inline int64_t element_offset(const expanse_tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int dim = 0;
  for (int64_t i : idx) off += i * t.strides[dim++];
  return off;
}

// The element at `offset` (in elements from t.data) as a double.
inline double read_element(const expanse_tensor& t, int64_t offset) {
  switch (t.dtype) {
    case EXPANSE_F64: return static_cast<const double*>(t.data)[offset];
    case EXPANSE_F32: return static_cast<const float*>(t.data)[offset];
    case EXPANSE_F16: return f16_to_double(static_cast<const uint16_t*>(t.data)[offset]);
    case EXPANSE_BF16: return bf16_to_double(static_cast<const uint16_t*>(t.data)[offset]);
    default: throw std::logic_error("reference: unknown dtype");
  }
}

// Writes v, rounded to the tensor's dtype, at `offset`. The tensor struct is const (it is a view);
// the memory it points to is not.
inline void write_element(const expanse_tensor& t, int64_t offset, double v) {
  switch (t.dtype) {
    case EXPANSE_F64: static_cast<double*>(t.data)[offset] = v; return;
    case EXPANSE_F32: static_cast<float*>(t.data)[offset] = static_cast<float>(v); return;  // RNE
    case EXPANSE_F16: static_cast<uint16_t*>(t.data)[offset] = double_to_f16(v); return;
    case EXPANSE_BF16: static_cast<uint16_t*>(t.data)[offset] = double_to_bf16(v); return;
    default: throw std::logic_error("reference: unknown dtype");
  }
}

// ------------------------------------------------------------------ whole slices

// M(i, j) = element at offset + i*row_stride + j*col_stride, for a [rows x cols] slice.
inline RowMatrix gather_matrix(const expanse_tensor& t, int64_t offset, int64_t rows,
                               int64_t row_stride, int64_t cols, int64_t col_stride) {
  RowMatrix m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      m(i, j) = read_element(t, offset + i * row_stride + j * col_stride);
  return m;
}

inline void scatter_matrix(const expanse_tensor& t, int64_t offset, int64_t row_stride,
                           int64_t col_stride, const RowMatrix& m) {
  for (int64_t i = 0; i < m.rows(); ++i)
    for (int64_t j = 0; j < m.cols(); ++j)
      write_element(t, offset + i * row_stride + j * col_stride, m(i, j));
}

inline Vector gather_vector(const expanse_tensor& t, int64_t offset, int64_t n, int64_t stride) {
  Vector v(n);
  for (int64_t i = 0; i < n; ++i) v(i) = read_element(t, offset + i * stride);
  return v;
}

inline void scatter_vector(const expanse_tensor& t, int64_t offset, int64_t stride, const Vector& v) {
  for (int64_t i = 0; i < v.size(); ++i) write_element(t, offset + i * stride, v(i));
}

// Token tensors are [b, t, heads, dim]. Rows t0 .. t0+len-1 of head `head` in batch `bi`, as a
// [len x dim] matrix.
inline RowMatrix gather_tokens(const expanse_tensor& x, int64_t bi, int64_t head, int64_t t0,
                               int64_t len) {
  return gather_matrix(x, element_offset(x, {bi, t0, head, 0}), len, x.strides[1], x.shape[3],
                       x.strides[3]);
}

inline void scatter_tokens(const expanse_tensor& x, int64_t bi, int64_t head, int64_t t0,
                           const RowMatrix& m) {
  scatter_matrix(x, element_offset(x, {bi, t0, head, 0}), x.strides[1], x.strides[3], m);
}

// Per-token scalars [b, t, heads] (log_g, l, rowmax): entries t0 .. t0+len-1.
inline Vector gather_token_scalars(const expanse_tensor& x, int64_t bi, int64_t head, int64_t t0,
                                   int64_t len) {
  return gather_vector(x, element_offset(x, {bi, t0, head}), len, x.strides[1]);
}

inline void scatter_token_scalars(const expanse_tensor& x, int64_t bi, int64_t head, int64_t t0,
                                  const Vector& v) {
  scatter_vector(x, element_offset(x, {bi, t0, head}), x.strides[1], v);
}

// log_g of tokens t0 .. t0+len-1, or zeros when the problem is not gated (log_g == NULL).
inline Vector gather_log_g(const expanse_tensor* log_g, int64_t bi, int64_t head, int64_t t0,
                           int64_t len) {
  if (log_g == nullptr) return Vector::Zero(len);
  return gather_token_scalars(*log_g, bi, head, t0, len);
}

// States [b, (n,) h, D, e] and [b, (n,) h, D]: `prefix` is the index of the leading dims, e.g.
// {bi, m, hi} for [b,n,h,D,e] or {bi, hi} for [b,h,D,e]; the last two dims (or one) are read.
inline RowMatrix gather_state(const expanse_tensor& s, std::initializer_list<int64_t> prefix) {
  const int nd = s.ndim;
  return gather_matrix(s, element_offset(s, prefix), s.shape[nd - 2], s.strides[nd - 2],
                       s.shape[nd - 1], s.strides[nd - 1]);
}

inline void scatter_state(const expanse_tensor& s, std::initializer_list<int64_t> prefix,
                          const RowMatrix& m) {
  const int nd = s.ndim;
  scatter_matrix(s, element_offset(s, prefix), s.strides[nd - 2], s.strides[nd - 1], m);
}

inline Vector gather_state_vector(const expanse_tensor& z, std::initializer_list<int64_t> prefix) {
  const int nd = z.ndim;
  return gather_vector(z, element_offset(z, prefix), z.shape[nd - 1], z.strides[nd - 1]);
}

inline void scatter_state_vector(const expanse_tensor& z, std::initializer_list<int64_t> prefix,
                                 const Vector& v) {
  const int nd = z.ndim;
  scatter_vector(z, element_offset(z, prefix), z.strides[nd - 1], v);
}

}  // namespace expanse_ref

#endif  // EXPANSE_REFERENCE_STRIDED_HPP
