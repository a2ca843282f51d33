// Host tensors in any dtype, with exact f16/bf16 conversions (round to nearest even).
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "cases.hpp"

namespace expanse::harness {

namespace {

// Round x to a binary format with `eb` exponent bits and `mb` mantissa bits (round to nearest even,
// straight from double: no double rounding through float) and return the bit pattern with its sign.
// NaN stays a quiet NaN, overflow gives infinity, subnormals are kept.
uint16_t round_to_small_float(double x, int eb, int mb) {
  const uint32_t sign_bit = (std::signbit(x) ? 1u : 0u) << (eb + mb);
  const uint32_t exp_all = (1u << eb) - 1u;
  if (std::isnan(x)) return static_cast<uint16_t>(sign_bit | (exp_all << mb) | (1u << (mb - 1)));
  const double a = std::fabs(x);
  if (std::isinf(a)) return static_cast<uint16_t>(sign_bit | (exp_all << mb));
  if (a == 0.0) return static_cast<uint16_t>(sign_bit);
  const int bias = (1 << (eb - 1)) - 1;
  const int emin = 1 - bias;
  uint64_t bits = 0;
  std::memcpy(&bits, &a, sizeof bits);
  const int biased = static_cast<int>((bits >> 52) & 0x7FF);
  int eu = biased - 1023;  // a in [2^eu, 2^(eu+1)) for a normal double
  if (biased == 0) {       // a subnormal double: far below any small format's range
    int e2 = 0;
    std::frexp(a, &e2);
    eu = e2 - 1;
  }
  if (eu < emin) {
    // Subnormal: units of 2^(emin - mb), round to nearest even. r == 2^mb encodes the smallest
    // normal, which the plain bit pattern gets right (the carry lands in the exponent field).
    const double q = std::ldexp(a, mb - emin);  // exact: a power-of-two scaling
    double r = std::floor(q);
    const double frac = q - r;
    if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
    return static_cast<uint16_t>(sign_bit | static_cast<uint32_t>(r));
  }
  // Normal: the 53-bit significand rounded to mb + 1 bits, nearest even, in integers (cheap: the
  // harness converts every element of a benchmark's inputs, hundreds of millions at 64k tokens).
  const int shift = 52 - mb;
  const uint64_t significand = (bits & ((uint64_t(1) << 52) - 1)) | (uint64_t(1) << 52);
  const uint64_t rest = significand & ((uint64_t(1) << shift) - 1), half = uint64_t(1) << (shift - 1);
  uint64_t r = significand >> shift;  // in [2^mb, 2^(mb+1))
  if (rest > half || (rest == half && (r & 1u))) ++r;
  if (r == (uint64_t(1) << (mb + 1))) {
    ++eu;
    r >>= 1;
  }
  if (eu > bias) return static_cast<uint16_t>(sign_bit | (exp_all << mb));  // overflow: infinity
  return static_cast<uint16_t>(sign_bit | (static_cast<uint32_t>(eu + bias) << mb) |
                               (static_cast<uint32_t>(r) - (1u << mb)));
}

double small_float_to_double(uint32_t bits, int eb, int mb) {
  const bool neg = ((bits >> (eb + mb)) & 1u) != 0;
  const uint32_t e = (bits >> mb) & ((1u << eb) - 1u);
  const uint32_t m = bits & ((1u << mb) - 1u);
  const int bias = (1 << (eb - 1)) - 1;
  double v;
  if (e == (1u << eb) - 1u)
    v = (m != 0) ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), 1 - bias - mb);
  else
    v = std::ldexp(static_cast<double>(m | (1u << mb)), static_cast<int>(e) - bias - mb);
  return neg ? -v : v;
}

}  // namespace

double f16_to_double(uint16_t h) { return small_float_to_double(h, 5, 10); }
uint16_t double_to_f16(double x) { return round_to_small_float(x, 5, 10); }
double bf16_to_double(uint16_t h) { return small_float_to_double(h, 8, 7); }
uint16_t double_to_bf16(double x) { return round_to_small_float(x, 8, 7); }

int64_t host_tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

double host_tensor::get(int64_t i) const {
  const unsigned char* p = bytes.data();
  switch (dtype) {
    case EXPANSE_F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return f16_to_double(h); }
    case EXPANSE_BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_double(h); }
    case EXPANSE_F32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case EXPANSE_F64: { double d; std::memcpy(&d, p + 8 * i, 8); return d; }
  }
  throw std::invalid_argument("host_tensor: unknown dtype");
}

void host_tensor::set(int64_t i, double value) {
  unsigned char* p = bytes.data();
  switch (dtype) {
    case EXPANSE_F16: { const uint16_t h = double_to_f16(value); std::memcpy(p + 2 * i, &h, 2); return; }
    case EXPANSE_BF16: { const uint16_t h = double_to_bf16(value); std::memcpy(p + 2 * i, &h, 2); return; }
    case EXPANSE_F32: { const float f = static_cast<float>(value); std::memcpy(p + 4 * i, &f, 4); return; }
    case EXPANSE_F64: std::memcpy(p + 8 * i, &value, 8); return;
  }
  throw std::invalid_argument("host_tensor: unknown dtype");
}

std::vector<double> host_tensor::to_double() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get(i);
  return out;
}

host_tensor host_tensor::zeros(expanse_dtype dtype, std::vector<int64_t> shape) {
  host_tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(static_cast<size_t>(t.numel()) * expanse_dtype_size(dtype), 0);
  return t;
}

}  // namespace expanse::harness
