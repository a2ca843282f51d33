#include "finite_check.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codes.hpp"
#include "errors.hpp"

namespace expanse::detail {
namespace {

enum class value_kind { finite, nan, pos_inf, neg_inf };

template <class Float>
value_kind classify_float(const unsigned char* p) {
  Float x;
  std::memcpy(&x, p, sizeof(x));
  if (std::isnan(x)) return value_kind::nan;
  if (std::isinf(x)) return x > 0 ? value_kind::pos_inf : value_kind::neg_inf;
  return value_kind::finite;
}

// f16 and bf16 by their bits: all-ones exponent (exp_mask) is an infinity (zero mantissa) or a NaN.
value_kind classify_half(const unsigned char* p, uint16_t exp_mask) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  if ((bits & exp_mask) != exp_mask) return value_kind::finite;
  const uint16_t mantissa = bits & static_cast<uint16_t>(~exp_mask & 0x7fff);
  if (mantissa != 0) return value_kind::nan;
  return bits & 0x8000 ? value_kind::neg_inf : value_kind::pos_inf;
}

value_kind classify(int32_t dtype, const unsigned char* p) {
  switch (dtype) {
    case EXPANSE_F16: return classify_half(p, 0x7c00);
    case EXPANSE_BF16: return classify_half(p, 0x7f80);
    case EXPANSE_F32: return classify_float<float>(p);
    case EXPANSE_F64: return classify_float<double>(p);
  }
  return value_kind::finite;
}

const char* kind_name(value_kind k) {
  return k == value_kind::nan ? "nan" : k == value_kind::pos_inf ? "inf" : "-inf";
}

// Gates may be -inf: a reset (docs/spec.md).
bool allows_neg_inf(const char* name) { return std::strcmp(name, "log_g") == 0 || std::strcmp(name, "A") == 0; }

// Walks every element of t (whose memory starts at `base`, a host copy or the tensor itself) in
// row-major index order; fails on the first value that is not allowed.
void scan(const char* op, const char* name, const expanse_tensor& t, const unsigned char* base) {
  const size_t esize = dtype_size_of(t.dtype);
  const bool neg_inf_ok = allows_neg_inf(name);
  int64_t index[EXPANSE_MAX_DIMS] = {0};
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) return;
  for (;;) {
    int64_t offset = 0;
    for (int i = 0; i < t.ndim; ++i) offset += index[i] * t.strides[i];
    const value_kind k = classify(t.dtype, base + offset * static_cast<int64_t>(esize));
    if (k != value_kind::finite && !(k == value_kind::neg_inf && neg_inf_ok)) {
      std::string at;
      for (int i = 0; i < t.ndim; ++i) at += (i ? ", " : "") + std::to_string(index[i]);
      fail(EXPANSE_ERROR_INVALID_ARGUMENT,
           "%s: argument '%s' holds a non-finite value (%s) at index [%s]; the context's finite check refuses "
           "NaN and infinities in inputs%s", op, name, kind_name(k), at.c_str(),
           neg_inf_ok ? " (-inf is allowed here: a reset)" : "");
    }
    int i = t.ndim - 1;
    for (; i >= 0; --i) {
      if (++index[i] < t.shape[i]) break;
      index[i] = 0;
    }
    if (i < 0) return;
  }
}

}  // namespace

void check_finite_inputs(const char* op, const op_decl& decl, const void* args, const fetch_fn* fetch) {
  for (int32_t a = 0; a < decl.tensor_count; ++a) {
    const expanse_tensor_arg_info& info = decl.tensor_infos[a];
    const expanse_tensor* t = tensor_at(args, info);
    if (info.role == EXPANSE_ARG_OUTPUT || !t) continue;
    int64_t span = 1;  // elements from the first to the last one, inclusive
    for (int i = 0; i < t->ndim; ++i) {
      if (t->shape[i] == 0) span = 0;
      else span += t->strides[i] * (t->shape[i] - 1);
    }
    if (span == 0) continue;
    if (!fetch) {
      scan(op, info.name, *t, static_cast<const unsigned char*>(t->data));
    } else {
      const std::vector<unsigned char> copy = (*fetch)(t->data, static_cast<size_t>(span) * dtype_size_of(t->dtype));
      scan(op, info.name, *t, copy.data());
    }
  }
}

}  // namespace expanse::detail
