#include "validate.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "codes.hpp"
#include "errors.hpp"
#include "layout.hpp"
#include "op_table.hpp"

namespace expanse::detail {
namespace {

constexpr unsigned bit(int dtype) { return dtype >= 0 && dtype < 32 ? 1u << dtype : 0u; }
constexpr unsigned kAnyFloat = bit(EXPANSE_F16) | bit(EXPANSE_BF16) | bit(EXPANSE_F32) | bit(EXPANSE_F64);
constexpr unsigned kStateFloat = bit(EXPANSE_F32) | bit(EXPANSE_F64);

std::string shape_text(const expanse_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + "]";
}

std::string dtype_list(unsigned mask) {
  std::string s;
  for (int d = EXPANSE_F16; d <= EXPANSE_F64; ++d)
    if (mask & bit(d)) s += (s.empty() ? "" : " or ") + std::string(dtype_name_of(d));
  return s;
}

// Checks one op's arguments; every message starts with the op name and names the argument.
class checker {
 public:
  checker(const char* op, device_requirement device) : op_(op), device_(device) {}

  [[noreturn]] void error(const char* fmt, ...) const __attribute__((format(printf, 2, 3))) {
    va_list args;
    va_start(args, fmt);
    std::string s = vformat(fmt, args);
    va_end(args);
    throw api_error{EXPANSE_ERROR_INVALID_ARGUMENT, std::string(op_) + ": " + s};
  }

  // Structural checks every tensor gets: rank, dtype code, sizes, strides, overflow, device, data.
  // `output` tensors must also not overlap themselves (no two elements at one address).
  const expanse_tensor& tensor(const char* name, const expanse_tensor* t, bool output) const {
    if (!t) error("argument '%s' is required but NULL", name);
    if (t->ndim < 0 || t->ndim > EXPANSE_MAX_DIMS)
      error("argument '%s': ndim must be in 0..%d, got %d", name, EXPANSE_MAX_DIMS, t->ndim);
    if (dtype_size_of(t->dtype) == 0)
      error("argument '%s': unknown dtype code %d (expected f16, bf16, f32 or f64)", name, t->dtype);
    __int128 elements = 1, last_offset = 0;
    for (int i = 0; i < t->ndim; ++i) {
      if (t->shape[i] < 0) error("argument '%s': dimension %d is negative (%lld)", name, i, (long long)t->shape[i]);
      if (t->strides[i] < 0)
        error("argument '%s': negative stride %lld in dimension %d is not supported", name,
              (long long)t->strides[i], i);
      elements *= t->shape[i];
      if (t->shape[i] > 0) last_offset += static_cast<__int128>(t->strides[i]) * (t->shape[i] - 1);
      if (elements > INT64_MAX || last_offset > INT64_MAX / 8)
        error("argument '%s': size of shape %s overflows", name, shape_text(*t).c_str());
    }
    if (elements > 0) {
      if (!t->data) error("argument '%s' has %lld elements but its data pointer is NULL", name, (long long)elements);
      if (t->device_type != device_.device_type)
        error("argument '%s' is on device type %d, but the context's backend works on device type %d (%s)", name,
              t->device_type, device_.device_type, device_.device_type == EXPANSE_DEVICE_CPU ? "CPU" : "GPU");
      if (device_.device_type != EXPANSE_DEVICE_CPU && t->device_id != device_.device_id)
        error("argument '%s' is on device %d, but the context uses device %d", name, t->device_id, device_.device_id);
      const uintptr_t align = dtype_size_of(t->dtype);
      if (reinterpret_cast<uintptr_t>(t->data) % align != 0)
        error("argument '%s': data pointer is not aligned to its element size (%u bytes)", name, unsigned(align));
      if (output) check_no_self_overlap(name, *t);
    }
    return *t;
  }

  const expanse_tensor* optional(const char* name, const expanse_tensor* t, bool output) const {
    return t ? &tensor(name, t, output) : nullptr;
  }

  void rank(const char* name, const expanse_tensor& t, int r, const char* dims) const {
    if (t.ndim != r) error("argument '%s' must have rank %d %s, got rank %d with shape %s", name, r, dims, t.ndim,
                           shape_text(t).c_str());
  }

  // Dimension `axis` of `t` must equal `expected`; `why` says where the expected value comes from.
  void dim(const char* name, const expanse_tensor& t, int axis, int64_t expected, const char* dim_name,
           const char* why) const {
    if (t.shape[axis] != expected)
      error("argument '%s': dimension %d (%s) must be %lld %s, got %lld (shape %s)", name, axis, dim_name,
            (long long)expected, why, (long long)t.shape[axis], shape_text(t).c_str());
  }

  void dtype(const char* name, const expanse_tensor& t, unsigned mask) const {
    if (!(mask & bit(t.dtype)))
      error("argument '%s' has dtype %s, expected %s", name, dtype_name_of(t.dtype),
            dtype_list(mask).c_str());
  }

  void same_dtype(const char* name, const expanse_tensor& t, const char* other, const expanse_tensor& o) const {
    if (t.dtype != o.dtype)
      error("argument '%s' has dtype %s, expected %s to match '%s'", name, dtype_name_of(t.dtype),
            dtype_name_of(o.dtype), other);
  }

  // Output dtype: the given dtype, or f64 (the reference's oracle outputs).
  void output_dtype(const char* name, const expanse_tensor& t, int expected, const char* source) const {
    if (t.dtype != expected && t.dtype != EXPANSE_F64)
      error("argument '%s' has dtype %s, expected %s (the dtype of '%s') or f64", name,
            dtype_name_of(t.dtype), dtype_name_of(expected), source);
  }

  int32_t degree(int32_t p, int32_t max_p) const {
    if (p < 1 || p > max_p) error("p must be in 1..%d, got %d", max_p, p);
    return p;
  }

  // Resolves D for the layout, checking d % d_tile.
  int64_t expanded(int32_t p, int64_t d, expanse_layout layout) const {
    if (layout.kind < EXPANSE_LAYOUT_SYMPOW || layout.kind > EXPANSE_LAYOUT_TENSOR)
      error("argument 'layout': unknown layout kind %d (expected sympow, tiled or tensor)", layout.kind);
    if (layout.kind == EXPANSE_LAYOUT_TILED) {
      if (layout.d_tile < 1) error("argument 'layout': tiled layout needs d_tile >= 1, got %d", layout.d_tile);
      if (d % layout.d_tile != 0)
        error("argument 'layout': tiled layout needs d %% d_tile == 0, got d=%lld, d_tile=%d", (long long)d,
              layout.d_tile);
    }
    const int64_t D = expanded_dim_checked(p, d, layout);
    if (D < 0) error("expanded dimension D overflows int64 for p=%d, d=%lld", p, (long long)d);
    return D;
  }

  double scale(double s, int64_t d) const {
    if (!std::isfinite(s)) error("argument 'scale' must be finite, got %g", s);
    return s == 0.0 ? 1.0 / std::sqrt(static_cast<double>(d)) : s;
  }

  void normalization(int32_t normalize, int32_t p) const {
    if (normalize != 0 && normalize != 1) error("argument 'normalize' must be 0 or 1, got %d", normalize);
    if (normalize && p % 2 != 0)
      error("normalize=1 needs an even p (normalization is only defined for even p); got p=%d", p);
  }

  void positive(const char* what, int64_t value) const {
    if (value < 1) error("%s must be >= 1, got %lld", what, (long long)value);
  }

 private:
  void check_no_self_overlap(const char* name, const expanse_tensor& t) const {
    std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent) of dims with extent > 1
    for (int i = 0; i < t.ndim; ++i)
      if (t.shape[i] > 1) dims.emplace_back(t.strides[i], t.shape[i]);
    std::sort(dims.begin(), dims.end());
    int64_t span = 1;  // elements covered by the faster dims
    for (auto [stride, extent] : dims) {
      if (stride < span)
        error("output argument '%s' overlaps itself (strides of shape %s alias elements)", name,
              shape_text(t).c_str());
      span = stride * extent;
    }
  }

  const char* op_;
  device_requirement device_;
};

// The chunk size a problem runs with: `requested`, but a chunk longer than the sequence is one
// chunk of t tokens (so no size below grows with the request: c may be anything up to INT64_MAX).
int64_t chunk_within(int64_t t, int64_t requested) { return std::min(requested, std::max<int64_t>(t, 1)); }

// ceil(t / c) without the overflow of (t + c - 1) / c.
int64_t chunks(int64_t t, int64_t c) { return c > 0 ? t / c + (t % c != 0) : 0; }

// q [b,t,hq,d], k [b,t,h,d], v [b,t,h,e], log_g [b,t,h]: fills b,t,hq,h,d,e and gating.
void token_tensors(const checker& ck, const expanse_tensor* qp, const expanse_tensor* kp,
                   const expanse_tensor* vp, const expanse_tensor* gp, expanse_problem& pr) {
  const expanse_tensor* first = qp ? qp : kp;
  const char* first_name = qp ? "q" : "k";
  const expanse_tensor& f = ck.tensor(first_name, first, false);
  ck.rank(first_name, f, 4, qp ? "[b,t,hq,d]" : "[b,t,h,d]");
  ck.dtype(first_name, f, kAnyFloat);
  pr.b = f.shape[0];
  pr.t = f.shape[1];
  pr.d = f.shape[3];
  pr.input_dtype = f.dtype;
  ck.positive("head dimension d", pr.d);
  if (kp) {
    const expanse_tensor& k = ck.tensor("k", kp, false);
    ck.rank("k", k, 4, "[b,t,h,d]");
    if (qp) {
      ck.same_dtype("k", k, "q", f);
      ck.dim("k", k, 0, pr.b, "b", "to match 'q'");
      ck.dim("k", k, 1, pr.t, "t", "to match 'q'");
      ck.dim("k", k, 3, pr.d, "d", "to match 'q'");
    }
    pr.h = k.shape[2];
  }
  if (qp) {
    pr.hq = f.shape[2];
    ck.positive("number of query heads hq (q's dimension 2)", pr.hq);
  }
  if (vp) {
    const expanse_tensor& v = ck.tensor("v", vp, false);
    ck.rank("v", v, 4, "[b,t,h,e]");
    ck.same_dtype("v", v, first_name, f);
    ck.dim("v", v, 0, pr.b, "b", "to match 'k'");
    ck.dim("v", v, 1, pr.t, "t", "to match 'k'");
    if (kp) ck.dim("v", v, 2, pr.h, "h", "to match 'k'");
    pr.e = v.shape[3];
    ck.positive("value dimension e", pr.e);
  }
  if (kp) {
    ck.positive("number of key/value heads h (k's dimension 2)", pr.h);
    if (!qp) pr.hq = pr.h;
    if (pr.hq % pr.h != 0)
      ck.error("grouped-query attention needs hq %% h == 0: q has hq=%lld heads, k has h=%lld", (long long)pr.hq,
               (long long)pr.h);
  }
  if (gp) {
    const expanse_tensor& g = ck.tensor("log_g", gp, false);
    ck.rank("log_g", g, 3, "[b,t,h]");
    ck.dtype("log_g", g, kStateFloat);
    ck.dim("log_g", g, 0, pr.b, "b", "to match the token tensors");
    ck.dim("log_g", g, 1, pr.t, "t", "to match the token tensors");
    if (pr.h) ck.dim("log_g", g, 2, pr.h, "h", "to match 'k'");
    pr.gated = 1;
  }
}

// A state S [b,(n,)h,D,e] and z [b,(n,)h,D]: `lead` holds the leading dims before h.
void state_tensors(const checker& ck, const char* sname, const expanse_tensor* sp, const char* zname,
                   const expanse_tensor* zp, bool output, std::vector<int64_t> lead, const char* sdims,
                   const char* zdims, expanse_problem& pr) {
  const int r = static_cast<int>(lead.size());
  std::vector<int64_t> s_shape = lead;
  s_shape.insert(s_shape.end(), {pr.h, pr.D, pr.e});
  const char* names[] = {"b", "n", "h", "D", "e"};
  auto dim_name = [&](int axis) {  // lead is [b] or [b,n]; then h, D, (e)
    return axis < r ? names[axis] : names[2 + (axis - r)];
  };
  if (sp) {
    const expanse_tensor& S = ck.tensor(sname, sp, output);
    ck.rank(sname, S, r + 3, sdims);
    ck.dtype(sname, S, kStateFloat);
    for (int i = 0; i < r + 3; ++i) ck.dim(sname, S, i, s_shape[i], dim_name(i), "(state shape)");
    pr.state_dtype = S.dtype;
  }
  if (zp) {
    const expanse_tensor& z = ck.tensor(zname, zp, output);
    ck.rank(zname, z, r + 2, zdims);
    ck.dtype(zname, z, kStateFloat);
    for (int i = 0; i < r + 2; ++i) ck.dim(zname, z, i, s_shape[i], dim_name(i), "(state shape)");
    if (sp && z.dtype != sp->dtype)
      ck.error("argument '%s' has dtype %s, expected %s to match '%s'", zname, dtype_name_of(z.dtype),
               dtype_name_of(sp->dtype), sname);
    if (!sp) pr.state_dtype = z.dtype;
  }
}

// A tensor shaped like the token outputs, [b,t,hq,e] or the per-row [b,t,hq].
void token_shaped(const checker& ck, const char* name, const expanse_tensor* tp, std::vector<int64_t> shape,
                  const char* dims, bool output = true) {
  const expanse_tensor& t = ck.tensor(name, tp, output);
  ck.rank(name, t, static_cast<int>(shape.size()), dims);
  const char* names[] = {"b", "t", "hq", "e"};
  for (size_t i = 0; i < shape.size(); ++i) ck.dim(name, t, int(i), shape[i], names[i], dims);
}

void validate_sympow_expand(const expanse_sympow_expand_args& a, checker& ck, validated_op& out) {
  expanse_problem& pr = out.problem;
  const expanse_tensor& x = ck.tensor("x", a.x, false);
  if (x.ndim < 1) ck.error("argument 'x' must have rank >= 1 [..., d], got rank 0");
  ck.dtype("x", x, kAnyFloat);
  pr.p = ck.degree(a.p, 6);
  pr.d = x.shape[x.ndim - 1];
  ck.positive("head dimension d (x's last dimension)", pr.d);
  pr.layout = a.layout;
  pr.D = ck.expanded(pr.p, pr.d, a.layout);
  pr.input_dtype = x.dtype;
  pr.rows = 1;
  for (int i = 0; i + 1 < x.ndim; ++i) pr.rows *= x.shape[i];
  const expanse_tensor& o = ck.tensor("out", a.out, true);
  ck.rank("out", o, x.ndim, "[..., D] (x's rank)");
  for (int i = 0; i + 1 < x.ndim; ++i) ck.dim("out", o, i, x.shape[i], "leading", "to match 'x'");
  ck.dim("out", o, x.ndim - 1, pr.D, "D", "(the expanded dimension for p, d and layout)");
  ck.output_dtype("out", o, x.dtype, "x");
  pr.output_dtype = o.dtype;
}

void validate_update_state(const expanse_update_state_args& a, checker& ck, validated_op& out) {
  expanse_problem& pr = out.problem;
  token_tensors(ck, nullptr, a.k, a.v, a.log_g, pr);
  pr.p = ck.degree(a.p, 4);
  ck.positive("chunk_size", a.chunk_size);
  pr.c = chunk_within(pr.t, a.chunk_size);
  pr.n = chunks(pr.t, pr.c);
  pr.layout = a.layout;
  pr.D = ck.expanded(pr.p, pr.d, a.layout);
  state_tensors(ck, "S", a.S, "z", a.z, true, {pr.b, pr.n}, "[b,n,h,D,e]", "[b,n,h,D]", pr);
  pr.output_dtype = pr.state_dtype;
}

void validate_discumsum(const expanse_discumsum_args& a, checker& ck, validated_op& out) {
  expanse_problem& pr = out.problem;
  const expanse_tensor& X = ck.tensor("X", a.X, false);
  if (X.ndim < 3) ck.error("argument 'X' must have rank >= 3 [b,n,h,...], got rank %d", X.ndim);
  ck.dtype("X", X, kAnyFloat);
  pr.b = X.shape[0];
  pr.n = X.shape[1];
  pr.h = X.shape[2];
  pr.input_dtype = X.dtype;
  pr.rows = 1;
  for (int i = 3; i < X.ndim; ++i) pr.rows *= X.shape[i];
  const expanse_tensor& A = ck.tensor("A", a.A, false);
  ck.rank("A", A, 3, "[b,n,h]");
  ck.dtype("A", A, kStateFloat);
  const char* lead[] = {"b", "n", "h"};
  for (int i = 0; i < 3; ++i) ck.dim("A", A, i, X.shape[i], lead[i], "to match 'X' [b,n,h,...]");
  if (const expanse_tensor* Y0 = ck.optional("Y_init", a.Y_init, false)) {
    ck.rank("Y_init", *Y0, X.ndim - 1, "[b,h,...] (X's rank - 1)");
    ck.dtype("Y_init", *Y0, kAnyFloat);
    ck.dim("Y_init", *Y0, 0, pr.b, "b", "to match 'X'");
    for (int i = 2; i < X.ndim; ++i)
      ck.dim("Y_init", *Y0, i - 1, X.shape[i], i == 2 ? "h" : "trailing", "to match 'X' [b,n,h,...]");
    pr.has_initial_state = 1;
  }
  const expanse_tensor& Y = ck.tensor("Y", a.Y, true);
  ck.rank("Y", Y, X.ndim, "[b,n+1,h,...] (X's rank)");
  ck.dtype("Y", Y, kStateFloat);
  for (int i = 0; i < X.ndim; ++i)
    ck.dim("Y", Y, i, i == 1 ? pr.n + 1 : X.shape[i], i < 3 ? (i == 1 ? "n+1" : lead[i]) : "trailing",
           "to match 'X' [b,n,h,...]");
  pr.output_dtype = pr.state_dtype = Y.dtype;
}

// The intra-chunk result (y [b,t,hq,e], l and rowmax [b,t,hq]) as outputs or as inputs.
void validate_intra_outputs(const checker& ck, const expanse_tensor* y, const expanse_tensor* l,
                            const expanse_tensor* m, bool output, const expanse_problem& pr) {
  token_shaped(ck, "y", y, {pr.b, pr.t, pr.hq, pr.e}, "[b,t,hq,e]", output);
  token_shaped(ck, "l", l, {pr.b, pr.t, pr.hq}, "[b,t,hq]", output);
  token_shaped(ck, "rowmax", m, {pr.b, pr.t, pr.hq}, "[b,t,hq]", output);
  for (auto [name, t] : {std::pair{"y", y}, std::pair{"l", l}, std::pair{"rowmax", m}}) ck.dtype(name, *t, kStateFloat);
}

void validate_query_state(const expanse_query_state_args& a, checker& ck, validated_op& out) {
  expanse_problem& pr = out.problem;
  token_tensors(ck, a.q, nullptr, nullptr, nullptr, pr);
  pr.p = ck.degree(a.p, 4);
  ck.normalization(a.normalize, pr.p);
  pr.normalize = a.normalize;
  pr.scale = ck.scale(a.scale, pr.d);
  ck.positive("chunk_size", a.chunk_size);
  pr.c = chunk_within(pr.t, a.chunk_size);
  pr.n = chunks(pr.t, pr.c);
  pr.layout = a.layout;
  pr.D = ck.expanded(pr.p, pr.d, a.layout);
  const expanse_tensor& S = ck.tensor("S", a.S, false);
  ck.rank("S", S, 5, "[b,n,h,D,e]");
  pr.h = S.shape[2];
  pr.e = S.shape[4];
  ck.positive("number of key/value heads h (S's dimension 2)", pr.h);
  ck.positive("value dimension e (S's dimension 4)", pr.e);
  if (pr.hq % pr.h != 0)
    ck.error("grouped-query attention needs hq %% h == 0: q has hq=%lld heads, S has h=%lld", (long long)pr.hq,
             (long long)pr.h);
  if (a.normalize && !a.z) ck.error("argument 'z' is required when normalize=1");
  state_tensors(ck, "S", a.S, "z", a.z, false, {pr.b, pr.n}, "[b,n,h,D,e]", "[b,n,h,D]", pr);
  if (a.log_g) {
    expanse_problem tmp = pr;  // reuse the token checks for log_g against q's b, t and S's h
    token_tensors(ck, a.q, nullptr, nullptr, a.log_g, tmp);
    pr.gated = 1;
  }
  if (a.y || a.l || a.rowmax) {
    if (!a.y || !a.l || !a.rowmax) ck.error("arguments 'y', 'l' and 'rowmax' (the intra-chunk result) go together");
    validate_intra_outputs(ck, a.y, a.l, a.rowmax, false, pr);
    pr.has_intra = 1;
  }
  token_shaped(ck, "o", a.o, {pr.b, pr.t, pr.hq, pr.e}, "[b,t,hq,e]");
  ck.output_dtype("o", *a.o, pr.input_dtype, "q");
  pr.output_dtype = a.o->dtype;
}

void validate_chunk_attention(const expanse_chunk_attention_args& a, checker& ck, validated_op& out) {
  expanse_problem& pr = out.problem;
  token_tensors(ck, a.q, a.k, a.v, a.log_g, pr);
  pr.p = ck.degree(a.p, 4);
  pr.scale = ck.scale(a.scale, pr.d);
  if (a.chunk_size < 0) ck.error("chunk_size must be >= 0 (0: one chunk over the whole sequence), got %lld",
                                 (long long)a.chunk_size);
  pr.c = chunk_within(pr.t, a.chunk_size > 0 ? a.chunk_size : pr.t);
  pr.n = chunks(pr.t, pr.c);
  validate_intra_outputs(ck, a.y, a.l, a.rowmax, true, pr);
  pr.output_dtype = pr.state_dtype = a.y->dtype;
}

void validate_power_attention(const expanse_power_attention_args& a, checker& ck, const device_requirement& device,
                              validated_op& out) {
  expanse_problem& pr = out.problem;
  token_tensors(ck, a.q, a.k, a.v, a.log_g, pr);
  pr.p = ck.degree(a.p, 4);
  ck.normalization(a.normalize, pr.p);
  pr.normalize = a.normalize;
  pr.scale = ck.scale(a.scale, pr.d);
  if (a.chunk_size < 0 && a.chunk_size != EXPANSE_CHUNK_AUTO)
    ck.error("chunk_size must be >= 0 (0: the quadratic form) or EXPANSE_CHUNK_AUTO (-1), got %lld",
             (long long)a.chunk_size);
  pr.layout = a.layout;
  pr.D = ck.expanded(pr.p, pr.d, a.layout);
  if (a.initial_z && !a.initial_S) ck.error("argument 'initial_z' needs 'initial_S'");
  if (a.initial_S) {
    if (a.normalize && !a.initial_z) ck.error("argument 'initial_z' is required with 'initial_S' when normalize=1");
    state_tensors(ck, "initial_S", a.initial_S, "initial_z", a.initial_z, false, {pr.b}, "[b,h,D,e]", "[b,h,D]", pr);
    pr.has_initial_state = 1;
  }
  if (a.final_z && !a.final_S) ck.error("argument 'final_z' needs 'final_S'");
  if (a.final_S) {
    state_tensors(ck, "final_S", a.final_S, "final_z", a.final_z, true, {pr.b}, "[b,h,D,e]", "[b,h,D]", pr);
    pr.want_final_state = 1;
  }
  token_shaped(ck, "o", a.o, {pr.b, pr.t, pr.hq, pr.e}, "[b,t,hq,e]");
  ck.output_dtype("o", *a.o, pr.input_dtype, "v");
  pr.output_dtype = a.o->dtype;
  // The form and chunk size last: a backend's choice may look at every other field.
  out.chunk_size = a.chunk_size == EXPANSE_CHUNK_AUTO ? device.choose_chunk_size(&pr) : a.chunk_size;
  if (out.chunk_size < 0)
    fail(EXPANSE_ERROR_INTERNAL, "power_attention: the backend chose chunk size %lld for EXPANSE_CHUNK_AUTO",
         (long long)out.chunk_size);
  pr.c = chunk_within(pr.t, out.chunk_size > 0 ? out.chunk_size : pr.t);
  pr.n = chunks(pr.t, pr.c);
}

// Adds the token axis to a [b,heads,dim] (or [b,heads]) tensor of a decoding step.
const expanse_tensor* with_token_axis(const checker& ck, const char* name, const expanse_tensor* t, int rank,
                                      expanse_tensor& storage) {
  if (!t) return nullptr;
  const expanse_tensor& x = ck.tensor(name, t, false);
  if (x.ndim == rank + 1) {
    if (x.shape[1] != 1) ck.error("argument '%s' of a decoding step must have t=1 in dimension 1, got %lld", name,
                                  (long long)x.shape[1]);
    return t;
  }
  if (x.ndim != rank)
    ck.error("argument '%s' of a decoding step must have rank %d or %d (with t=1), got rank %d", name, rank,
             rank + 1, x.ndim);
  storage = x;
  storage.ndim = rank + 1;
  for (int i = rank - 1; i >= 1; --i) {
    storage.shape[i + 1] = x.shape[i];
    storage.strides[i + 1] = x.strides[i];
  }
  storage.shape[1] = 1;
  storage.strides[1] = 0;
  return &storage;
}

void validate_power_attention_step(const expanse_power_attention_step_args& a, checker& ck, validated_op& out) {
  expanse_problem& pr = out.problem;
  expanse_power_attention_step_args& s = out.step_args;
  s = a;
  s.q = with_token_axis(ck, "q", a.q, 3, out.step_tensors[0]);
  s.k = with_token_axis(ck, "k", a.k, 3, out.step_tensors[1]);
  s.v = with_token_axis(ck, "v", a.v, 3, out.step_tensors[2]);
  s.log_g = with_token_axis(ck, "log_g", a.log_g, 2, out.step_tensors[3]);
  s.o = const_cast<expanse_tensor*>(with_token_axis(ck, "o", a.o, 3, out.step_tensors[4]));
  token_tensors(ck, s.q, s.k, s.v, s.log_g, pr);
  pr.p = ck.degree(a.p, 4);
  ck.normalization(a.normalize, pr.p);
  pr.normalize = a.normalize;
  pr.scale = ck.scale(a.scale, pr.d);
  pr.layout = a.layout;
  pr.D = ck.expanded(pr.p, pr.d, a.layout);
  pr.c = 1;
  pr.n = 1;
  if (a.normalize && !a.z) ck.error("argument 'z' is required when normalize=1");
  state_tensors(ck, "S", a.S, "z", a.z, true, {pr.b}, "[b,h,D,e]", "[b,h,D]", pr);
  pr.has_initial_state = pr.want_final_state = 1;
  token_shaped(ck, "o", s.o, {pr.b, 1, pr.hq, pr.e}, "[b,1,hq,e]");
  ck.output_dtype("o", *s.o, pr.input_dtype, "v");
  pr.output_dtype = s.o->dtype;
  out.args = &out.step_args;
}

// Byte range [first, last) of a tensor's elements; empty for a tensor without elements.
struct byte_range {
  uintptr_t first = 0, last = 0;
};

byte_range bytes_of(const expanse_tensor& t) {
  int64_t last_offset = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return {};
    last_offset += t.strides[i] * (t.shape[i] - 1);  // bounded by validation (tensor())
  }
  const uintptr_t first = reinterpret_cast<uintptr_t>(t.data);
  return {first, first + static_cast<uintptr_t>(last_offset + 1) * dtype_size_of(t.dtype)};
}

// An output (or in-place argument) shares no memory with any other argument: the library writes
// outputs while it still reads the inputs, and one output's writes would corrupt another's. The
// check is on byte ranges (first to last element), so interleaved views of one buffer are refused
// too, as "may overlap".
void check_no_overlap(const checker& ck, const op_tensor_table& table, const void* args) {
  for (int32_t i = 0; i < table.count; ++i) {
    const expanse_tensor_arg_info& out = table.args[i];
    const expanse_tensor* o = tensor_at(args, out);
    if (out.role == EXPANSE_ARG_INPUT || !o) continue;
    const byte_range ro = bytes_of(*o);
    if (ro.first == ro.last) continue;
    for (int32_t j = 0; j < table.count; ++j) {
      const expanse_tensor_arg_info& other = table.args[j];
      const expanse_tensor* t = tensor_at(args, other);
      if (j == i || !t || (other.role != EXPANSE_ARG_INPUT && j < i)) continue;  // each pair of outputs once
      const byte_range rt = bytes_of(*t);
      if (rt.first < ro.last && ro.first < rt.last)
        ck.error("argument '%s' overlaps argument '%s' in memory: %s must not share memory with any other "
                 "argument", out.name, other.name, out.role == EXPANSE_ARG_IN_OUT ? "a state updated in place" : "an output");
    }
  }
}

}  // namespace

void validate_op(int32_t kind, const void* args, const device_requirement& device, validated_op& out) {
  out = validated_op{};
  out.args = args;
  const op_tensor_table* table = op_tensors(kind);
  if (!table) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "unknown operation kind %d", kind);
  checker ck(expanse_op_name(static_cast<expanse_op_kind>(kind)), device);
  if (!args) ck.error("argument 'args' is NULL");
  for (int32_t i = 0; i < table->count; ++i)
    if (table->args[i].required && !tensor_at(args, table->args[i]))
      ck.error("argument '%s' is required but NULL", table->args[i].name);
  switch (kind) {
    case EXPANSE_OP_SYMPOW_EXPAND:
      validate_sympow_expand(*static_cast<const expanse_sympow_expand_args*>(args), ck, out); break;
    case EXPANSE_OP_UPDATE_STATE:
      validate_update_state(*static_cast<const expanse_update_state_args*>(args), ck, out); break;
    case EXPANSE_OP_DISCUMSUM:
      validate_discumsum(*static_cast<const expanse_discumsum_args*>(args), ck, out); break;
    case EXPANSE_OP_QUERY_STATE:
      validate_query_state(*static_cast<const expanse_query_state_args*>(args), ck, out); break;
    case EXPANSE_OP_CHUNK_ATTENTION:
      validate_chunk_attention(*static_cast<const expanse_chunk_attention_args*>(args), ck, out); break;
    case EXPANSE_OP_POWER_ATTENTION:
      validate_power_attention(*static_cast<const expanse_power_attention_args*>(args), ck, device, out); break;
    case EXPANSE_OP_POWER_ATTENTION_STEP:
      validate_power_attention_step(*static_cast<const expanse_power_attention_step_args*>(args), ck, out); break;
  }
  check_no_overlap(ck, *table, args);
}

}  // namespace expanse::detail
