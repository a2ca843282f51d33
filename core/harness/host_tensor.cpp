// Host tensors in any dtype, with exact f16/bf16 conversions (round to nearest even).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "cases.hpp"

namespace expanse::harness {

double f16_to_double(uint16_t h) {
  const int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double value;
  if (exponent == 0) value = std::ldexp(mantissa, -24);  // zero or subnormal
  else if (exponent == 31) value = mantissa ? NAN : INFINITY;
  else value = std::ldexp(mantissa + 1024, exponent - 25);
  return sign ? -value : value;
}

uint16_t double_to_f16(double x) {
  // Via f32 would round twice; round directly from the double instead.
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;
  double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0, -14)) {          // subnormal: multiples of 2^-24
    const double m = std::nearbyint(std::ldexp(a, 24));  // default rounding mode: to nearest even
    return sign | static_cast<uint16_t>(m);
  }
  int e;
  const double frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  double m = std::nearbyint(std::ldexp(frac, 11));  // 11 significant bits
  if (m == 2048.0) { m = 1024.0; ++e; }
  const int biased = e - 1 + 15;
  if (biased >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>((biased << 10) | (static_cast<int>(m) - 1024));
}

double bf16_to_double(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t double_to_bf16(double x) {
  if (std::isnan(x)) return 0x7fc0;
  // bf16 has 8 significant bits; round the double there directly (no double rounding via f32).
  const double a = std::fabs(x);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (a == 0.0) return sign;
  int e;
  std::frexp(a, &e);
  const int lowest = -133;                 // exponent of bf16's smallest subnormal step: 2^-133
  const int step_exp = std::max(e - 8, lowest);
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -step_exp)), step_exp);
  const float f = static_cast<float>(x < 0 ? -r : r);  // exact: r has at most 8 significant bits
  if (std::isinf(f) || r > 3.3895313892515355e38) return sign | 0x7f80;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

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
