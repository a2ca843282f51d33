// One validation for every operation: it walks the operation's declaration (op_table.cpp), checking
// each parameter by its kind and each tensor by its shape rule and dtype rule, binding the sizes
// (b, t, hq, h, d, e, ...) where a tensor first shows them and holding every later tensor to them.
// No operation is spelled out here.
#include "validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstring>
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

// The sizes a shape rule names (expanse_tensor_arg_info::dims).
enum symbol : int { kB, kT, kHq, kH, kDh, kE, kDphi, kN, kSymbolCount, kNPlus1, kRest };
const char* const kSymbolNames[kSymbolCount] = {"b", "t", "hq", "h", "d", "e", "D", "n"};
const char* const kSymbolMeaning[kSymbolCount] = {
    "batch size b", "sequence length t", "number of query heads hq", "number of key/value heads h",
    "head dimension d", "value dimension e", "expanded dimension D", "number of chunks n"};

// A shape rule, parsed: up to EXPANSE_MAX_DIMS + 1 symbols ("..." counts as one).
struct rule {
  int symbols[EXPANSE_MAX_DIMS + 1];
  int count = 0;
  int rest_at = -1;  // position of "...", -1 when none
  int omit_at = -1;  // position of "t?", the token axis a tensor may omit when t = 1

  explicit rule(const char* dims) {
    const char* p = dims;
    while (*p) {
      while (*p == ' ') ++p;
      const char* end = p;
      while (*end && *end != ' ') ++end;
      if (end == p) break;
      const std::string word(p, end);
      int s = -1;
      if (word == "...") s = kRest, rest_at = count;
      else if (word == "n+1") s = kNPlus1;
      else if (word == "t?") s = kT, omit_at = count;
      for (int i = 0; i < kSymbolCount && s < 0; ++i)
        if (word == kSymbolNames[i]) s = i;
      if (s < 0 || count == EXPANSE_MAX_DIMS + 1) fail(EXPANSE_ERROR_INTERNAL, "bad shape rule '%s'", dims);
      symbols[count++] = s;
      p = end;
    }
  }
  // "[b,t,hq,d]"
  std::string text() const {
    std::string s = "[";
    for (int i = 0; i < count; ++i) {
      const int y = symbols[i];
      s += (i ? "," : "") + std::string(y < kSymbolCount ? kSymbolNames[y] : y == kNPlus1 ? "n+1" : "...");
    }
    return s + "]";
  }
};

// The rules of every op parsed once (the first validation), and the symbols each op needs >= 1.
struct parsed_op {
  std::vector<rule> rules;
  unsigned positive = 0;  // bit s: symbol s must be >= 1
};

const parsed_op& parsed(const op_decl& op) {
  static const std::vector<parsed_op> all = [] {
    std::vector<parsed_op> result;
    for (int32_t k = 0; k < EXPANSE_OP_COUNT; ++k) {
      const op_decl& o = *op_declaration(k);
      parsed_op p;
      for (int i = 0; i < o.tensor_count; ++i) p.rules.emplace_back(o.tensors[i].info.dims);
      const rule positive(o.positive);
      for (int i = 0; i < positive.count; ++i)
        if (positive.symbols[i] < kSymbolCount) p.positive |= 1u << positive.symbols[i];
      result.push_back(std::move(p));
    }
    return result;
  }();
  return all[size_t(&op - op_declaration(0))];
}

// Checks one call's arguments against its declaration. Throws api_error naming the argument; every
// message starts with the operation's name.
class checker {
 public:
  // device: where tensors must live; nullptr when only shapes are wanted (output_shape).
  checker(const op_decl& op, const void* args, const device_requirement* device)
      : op_(op), parsed_(parsed(op)), args_(static_cast<const char*>(args)), device_(device) {}

  [[noreturn]] void error(const char* fmt, ...) const __attribute__((format(printf, 2, 3))) {
    va_list list;
    va_start(list, fmt);
    std::string s = vformat(fmt, list);
    va_end(list);
    throw api_error{EXPANSE_ERROR_INVALID_ARGUMENT, std::string(op_.name) + ": " + s};
  }

  const expanse_tensor* tensor(int i) const { return tensor_at(args_, op_.tensors[i].info); }
  int index_of(const char* name) const {
    for (int i = 0; i < op_.tensor_count; ++i)
      if (std::strcmp(op_.tensors[i].info.name, name) == 0) return i;
    fail(EXPANSE_ERROR_INTERNAL, "%s: no tensor '%s' in the table", op_.name, name);
  }

  // Which tensors are given: required ones, and the rules between optional ones.
  void presence(bool outputs_too) const {
    const int32_t normalize = param_int32(param_check::flag);
    for (int i = 0; i < op_.tensor_count; ++i) {
      const tensor_decl& t = op_.tensors[i];
      const bool present = tensor(i) != nullptr, checked = outputs_too || t.info.role == EXPANSE_ARG_INPUT;
      if (!checked) continue;
      if (t.info.required && !present) error("argument '%s' is required but NULL", t.info.name);
      const bool needed_present = !t.needs || tensor(index_of(t.needs));
      if (present && !needed_present) error("argument '%s' needs '%s'", t.info.name, t.needs);
      if (t.with_normalize && normalize == 1 && needed_present && !present) {
        if (t.needs) error("argument '%s' is required with '%s' when normalize=1", t.info.name, t.needs);
        error("argument '%s' is required when normalize=1", t.info.name);
      }
    }
    for (int i = 0; i < op_.tensor_count; ++i) {
      const uint8_t g = op_.tensors[i].group;
      if (!g) continue;
      std::vector<std::string> names;
      bool some = false, all = true;
      for (int j = 0; j < op_.tensor_count; ++j)
        if (op_.tensors[j].group == g) {
          names.push_back("'" + std::string(op_.tensors[j].info.name) + "'");
          some = some || tensor(j);
          all = all && tensor(j);
        }
      std::string list;  // 'y', 'l' and 'rowmax'
      for (size_t j = 0; j < names.size(); ++j)
        list += (j == 0 ? "" : j + 1 == names.size() ? " and " : ", ") + names[j];
      if (some && !all) error("arguments %s go together: give all of them or none", list.c_str());
    }
  }

  // The parameters that need no sizes; the rest (scale, layout, chunk) come with the sizes.
  void early_params(expanse_problem& pr) const {
    for (int i = 0; i < op_.param_count; ++i) {
      const param_decl& p = op_.params[i];
      if (p.check == param_check::degree) {
        const int32_t v = param_int32(param_check::degree);
        if (v < 1 || v > op_.max_p) error("p must be in 1..%d, got %d", op_.max_p, v);
        pr.p = v;
      } else if (p.check == param_check::flag) {
        const int32_t v = param_int32(param_check::flag);
        if (v != 0 && v != 1) error("argument '%s' must be 0 or 1, got %d", p.info.name, v);
        if (v && pr.p % 2 != 0)
          error("normalize=1 needs an even p (normalization is only defined for even p); got p=%d", pr.p);
        pr.normalize = v;
      } else if (p.check == param_check::chunk || p.check == param_check::chunk_or_all ||
                 p.check == param_check::chunk_or_auto) {
        const int64_t c = chunk_param();
        if (p.check == param_check::chunk && c < 1) error("chunk_size must be >= 1, got %lld", (long long)c);
        if (p.check == param_check::chunk_or_all && c < 0)
          error("chunk_size must be >= 0 (0: one chunk over the whole sequence), got %lld", (long long)c);
        if (p.check == param_check::chunk_or_auto && c < 0 && c != EXPANSE_CHUNK_AUTO)
          error("chunk_size must be >= 0 (0: the quadratic form) or EXPANSE_CHUNK_AUTO (-1), got %lld", (long long)c);
      }
    }
  }

  // Every given tensor (inputs only when `outputs_too` is false), in table order.
  void tensors(bool outputs_too, expanse_problem& pr, validated_op* out) {
    for (int i = 0; i < op_.tensor_count; ++i) {
      const tensor_decl& decl = op_.tensors[i];
      const expanse_tensor* t = tensor(i);
      if (!t || (!outputs_too && decl.info.role != EXPANSE_ARG_INPUT)) continue;
      const bool output = decl.info.role != EXPANSE_ARG_INPUT;
      structure(decl.info.name, *t, output);
      const rule& r = parsed_.rules[size_t(i)];
      const expanse_tensor& full = with_full_rank(decl.info.name, *t, r, i, out);
      rank(decl.info.name, full, r);
      dtype(decl, full);
      dims(decl.info.name, full, r);
      if (first_ == nullptr) first_ = &full, pr.input_dtype = full.dtype;
      if (decl.flags & kGates) pr.gated = 1;
      if (decl.flags & kInitial) pr.has_initial_state = 1;
      if (decl.flags & kFinal) pr.want_final_state = 1;
      if (decl.flags & kIntra) pr.has_intra = 1;
      if ((decl.flags & kState) && !state_seen_) pr.state_dtype = full.dtype, state_seen_ = true;
      if (decl.flags & kPrimary) pr.output_dtype = full.dtype;
    }
    if (out && omitted_axis_) {
      std::memcpy(out->canonical_args, args_, op_.args_size);
      for (int i = 0; i < op_.tensor_count; ++i)
        if (canonical_[i]) {
          const expanse_tensor* p = &out->canonical_tensors[i];
          std::memcpy(out->canonical_args + op_.tensors[i].info.offset, &p, sizeof(p));
        }
      out->args = out->canonical_args;
    }
  }

  // The sizes the tensors left to derive, the parameters that need them, and the problem's sizes.
  void finish(expanse_problem& pr) {
    if (!bound_[kHq] && bound_[kH]) bind_value(kHq, value(kH), from_[kH]);
    if (bound_[kHq] && bound_[kH] && value(kH) > 0 && value(kHq) % value(kH) != 0)
      error("grouped-query attention needs hq %% h == 0: '%s' has hq=%lld heads, '%s' has h=%lld", from_[kHq],
            (long long)value(kHq), from_[kH], (long long)value(kH));
    pr.b = bound_[kB] ? value(kB) : 0;
    pr.t = bound_[kT] ? value(kT) : 0;
    pr.hq = bound_[kHq] ? value(kHq) : 0;
    pr.h = bound_[kH] ? value(kH) : 0;
    pr.d = bound_[kDh] ? value(kDh) : 0;
    pr.e = bound_[kE] ? value(kE) : 0;
    if (op_.max_p > 0) pr.D = derived(kDphi);
    for (int i = 0; i < op_.param_count; ++i) {
      const param_decl& p = op_.params[i];
      if (p.check == param_check::layout) pr.layout = layout();
      if (p.check == param_check::scale) {
        double s;
        std::memcpy(&s, args_ + p.info.offset, sizeof(s));
        if (!std::isfinite(s)) error("argument 'scale' must be finite, got %g", s);
        pr.scale = s == 0.0 ? 1.0 / std::sqrt(static_cast<double>(pr.d)) : s;
      }
    }
    if (has_chunk() && chunk_check() == param_check::chunk_or_auto) {
      // power_attention's form and chunk size: choose_chunk, once the problem is whole.
    } else if (has_chunk()) {
      pr.c = chunk_length();
      pr.n = derived(kN);
    } else if (bound_[kN]) {
      pr.n = value(kN);  // discumsum: its chunks are its inputs'
    } else if (rule_has_omittable_) {
      pr.c = std::max<int64_t>(pr.t, 1);  // a decoding step's tokens: one chunk, unless choose_chunk splits them
      pr.n = pr.t > 0;
    }
    if (rest_bound_) {
      pr.rows = 1;
      for (int64_t extent : rest_) pr.rows *= extent;
    }
  }

  // power_attention's form and chunk size for EXPANSE_CHUNK_AUTO: asked last, as a backend's rule may
  // look at every other field.
  // A decoding step of t > 1 tokens runs as power_attention does (docs/spec.md): its chunks by the same rule.
  void choose_chunk(expanse_problem& pr, validated_op& out) const {
    const bool step = rule_has_omittable_ && !has_chunk() && pr.t > 1;  // its chunks always automatic
    if (!step && (!has_chunk() || chunk_check() != param_check::chunk_or_auto)) return;
    const int64_t requested = step ? EXPANSE_CHUNK_AUTO : chunk_param();
    out.chunk_size = requested == EXPANSE_CHUNK_AUTO ? device_->choose_chunk_size(&pr) : requested;
    if (out.chunk_size < 0)
      fail(EXPANSE_ERROR_INTERNAL, "%s: the backend chose chunk size %lld for EXPANSE_CHUNK_AUTO (t=%lld)", op_.name,
           (long long)out.chunk_size, (long long)pr.t);
    pr.c = std::min(out.chunk_size > 0 ? out.chunk_size : pr.t, std::max<int64_t>(pr.t, 1));
    pr.n = chunks(pr.t, pr.c);
  }

  // An output's shape by its rule, from the sizes the inputs bound; a token axis that tensors may
  // omit is omitted when the first input omits it.
  int shape_of(int i, int64_t* shape) {
    const rule& r = parsed_.rules[size_t(i)];
    int n = 0;
    for (int k = 0; k < r.count; ++k) {
      const int s = r.symbols[k];
      if (s == kRest) {
        for (int64_t extent : rest_) shape[n++] = extent;
      } else if (k == r.omit_at && first_omitted_axis_) {
        continue;
      } else {
        shape[n++] = s == kNPlus1 ? derived(kN) + 1 : derived(s);
      }
    }
    return n;
  }

  // The dtype the library writes to output i by default.
  int32_t default_dtype(int i, const expanse_problem& pr) const {
    const tensor_decl& t = op_.tensors[i];
    switch (t.dtype) {
      case dtype_rule::output_of: return tensor(index_of(t.other))->dtype;
      case dtype_rule::same_as: {
        const int j = index_of(t.other);
        return tensor(j) && op_.tensors[j].info.role == EXPANSE_ARG_INPUT ? tensor(j)->dtype : default_dtype(j, pr);
      }
      case dtype_rule::state_float:
      case dtype_rule::any_float: break;
    }
    return pr.input_dtype == EXPANSE_F64 ? EXPANSE_F64 : EXPANSE_F32;
  }

 private:
  // Structural checks every tensor gets: rank, dtype code, sizes, strides, overflow, device, data.
  // `output` tensors must also not overlap themselves (no two elements at one address).
  void structure(const char* name, const expanse_tensor& t, bool output) const {
    if (t.ndim < 0 || t.ndim > EXPANSE_MAX_DIMS)
      error("argument '%s': ndim must be in 0..%d, got %d", name, EXPANSE_MAX_DIMS, t.ndim);
    if (dtype_size_of(t.dtype) == 0)
      error("argument '%s': unknown dtype code %d (expected f16, bf16, f32 or f64)", name, t.dtype);
    __int128 elements = 1, last_offset = 0;
    for (int i = 0; i < t.ndim; ++i) {
      if (t.shape[i] < 0) error("argument '%s': dimension %d is negative (%lld)", name, i, (long long)t.shape[i]);
      if (t.strides[i] < 0)
        error("argument '%s': negative stride %lld in dimension %d is not supported", name, (long long)t.strides[i], i);
      elements *= t.shape[i];
      if (t.shape[i] > 0) last_offset += static_cast<__int128>(t.strides[i]) * (t.shape[i] - 1);
      if (elements > INT64_MAX || last_offset > INT64_MAX / 8)
        error("argument '%s': size of shape %s overflows", name, shape_text(t).c_str());
    }
    if (elements == 0 || !device_) return;
    if (!t.data) error("argument '%s' has %lld elements but its data pointer is NULL", name, (long long)elements);
    if (t.device_type != device_->device_type)
      error("argument '%s' is on device type %d, but the context's backend works on device type %d (%s)", name,
            t.device_type, device_->device_type, device_->device_type == EXPANSE_DEVICE_CPU ? "CPU" : "GPU");
    if (device_->device_type != EXPANSE_DEVICE_CPU && t.device_id != device_->device_id)
      error("argument '%s' is on device %d, but the context uses device %d", name, t.device_id, device_->device_id);
    const uintptr_t align = dtype_size_of(t.dtype);
    if (reinterpret_cast<uintptr_t>(t.data) % align != 0)
      error("argument '%s': data pointer is not aligned to its element size (%u bytes)", name, unsigned(align));
    if (output) no_self_overlap(name, t);
  }

  void no_self_overlap(const char* name, const expanse_tensor& t) const {
    std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent) of dims with extent > 1
    for (int i = 0; i < t.ndim; ++i)
      if (t.shape[i] > 1) dims.emplace_back(t.strides[i], t.shape[i]);
    std::sort(dims.begin(), dims.end());
    int64_t span = 1;  // elements covered by the faster dims
    for (auto [stride, extent] : dims) {
      if (stride < span)
        error("output argument '%s' overlaps itself (strides of shape %s alias elements)", name, shape_text(t).c_str());
      span = stride * extent;
    }
  }

  // A tensor whose rule has a token axis "t?" may omit it where t = 1: the view with the axis put
  // back (size 1, stride 0).
  const expanse_tensor& with_full_rank(const char* name, const expanse_tensor& t, const rule& r, int i,
                                       validated_op* out) {
    if (r.omit_at < 0) return t;
    rule_has_omittable_ = true;
    const bool omitted = t.ndim == r.count - 1;
    if (first_ == nullptr) first_omitted_axis_ = omitted;
    if (!omitted) {
      if (t.ndim != r.count)
        error("argument '%s' must have rank %d %s, or %d without its token axis (one token), got rank %d", name,
              r.count, r.text().c_str(), r.count - 1, t.ndim);
      return t;
    }
    expanse_tensor& full = out ? out->canonical_tensors[i] : scratch_[i];
    full = t;
    full.ndim = t.ndim + 1;
    for (int k = t.ndim - 1; k >= r.omit_at; --k) {
      full.shape[k + 1] = t.shape[k];
      full.strides[k + 1] = t.strides[k];
    }
    full.shape[r.omit_at] = 1;
    full.strides[r.omit_at] = 0;
    canonical_[i] = omitted_axis_ = true;
    if (bound_[kT] && value(kT) != 1)
      error("argument '%s' has rank %d: without its token axis it is one token, but '%s' has t=%lld", name, t.ndim,
            from_[kT], (long long)value(kT));
    return full;
  }

  void rank(const char* name, const expanse_tensor& t, const rule& r) const {
    if (r.rest_at >= 0) {
      if (t.ndim < r.count - 1)
        error("argument '%s' must have rank >= %d %s, got rank %d", name, r.count - 1, r.text().c_str(), t.ndim);
    } else if (t.ndim != r.count) {
      error("argument '%s' must have rank %d %s, got rank %d with shape %s", name, r.count, r.text().c_str(), t.ndim,
            shape_text(t).c_str());
    }
  }

  void dtype(const tensor_decl& decl, const expanse_tensor& t) const {
    const char* name = decl.info.name;
    const unsigned mask = decl.dtype == dtype_rule::any_float ? kAnyFloat : kStateFloat;
    if (decl.dtype == dtype_rule::any_float || decl.dtype == dtype_rule::state_float) {
      if (!(mask & bit(t.dtype)))
        error("argument '%s' has dtype %s, expected %s", name, dtype_name_of(t.dtype), dtype_list(mask).c_str());
      return;
    }
    const expanse_tensor* other = tensor(index_of(decl.other));
    if (!other) return;  // checked when the other one is given
    if (decl.dtype == dtype_rule::same_as && t.dtype != other->dtype)
      error("argument '%s' has dtype %s, expected %s to match '%s'", name, dtype_name_of(t.dtype),
            dtype_name_of(other->dtype), decl.other);
    if (decl.dtype == dtype_rule::output_of && t.dtype != other->dtype && t.dtype != EXPANSE_F64)
      error("argument '%s' has dtype %s, expected %s (the dtype of '%s') or f64", name, dtype_name_of(t.dtype),
            dtype_name_of(other->dtype), decl.other);
  }

  // Binds each symbol of the rule the first time a tensor shows it; holds the tensor to it after.
  void dims(const char* name, const expanse_tensor& t, const rule& r) {
    const int rest_len = t.ndim - (r.count - 1);
    int axis = 0;
    for (int k = 0; k < r.count; ++k) {
      const int s = r.symbols[k];
      if (s == kRest) {
        if (!rest_bound_) {
          rest_.assign(t.shape + axis, t.shape + axis + rest_len);
          rest_from_ = name, rest_bound_ = true;
        } else if (int(rest_.size()) != rest_len) {
          error("argument '%s' must have rank %d %s (the rank of '%s' less its named dimensions is %zu), got rank %d",
                name, int(rest_.size()) + r.count - 1, r.text().c_str(), rest_from_, rest_.size(), t.ndim);
        } else {
          for (int j = 0; j < rest_len; ++j)
            if (t.shape[axis + j] != rest_[j])
              error("argument '%s': dimension %d (...) must be %lld to match '%s', got %lld (shape %s)", name, axis + j,
                    (long long)rest_[j], rest_from_, (long long)t.shape[axis + j], shape_text(t).c_str());
        }
        axis += rest_len;
        continue;
      }
      const int64_t extent = t.shape[axis];
      if (s == kNPlus1) {
        const int64_t n = derived(kN);
        if (extent != n + 1)
          error("argument '%s': dimension %d (n+1) must be %lld (one more than %s), got %lld (shape %s)", name, axis,
                (long long)(n + 1), origin(kN).c_str(), (long long)extent, shape_text(t).c_str());
      } else if (!bound_[s] && !is_derived(s)) {
        bind(s, extent, name, axis);
      } else {
        const int64_t expected = derived(s);
        if (extent != expected)
          error("argument '%s': dimension %d (%s) must be %lld %s, got %lld (shape %s)", name, axis, kSymbolNames[s],
                (long long)expected, origin(s).c_str(), (long long)extent, shape_text(t).c_str());
      }
      ++axis;
    }
  }

  void bind(int s, int64_t extent, const char* name, int axis) {
    if ((parsed_.positive >> s & 1u) && extent < 1)
      error("%s ('%s' dimension %d) must be >= 1, got %lld", kSymbolMeaning[s], name, axis, (long long)extent);
    bind_value(s, extent, name);
  }
  void bind_value(int s, int64_t extent, const char* name) {
    values_[s] = extent;
    bound_[s] = true;
    from_[s] = name;
  }
  int64_t value(int s) const { return values_[s]; }

  // D always derives from p, d and the layout; n from t and the chunk size where the op has one.
  bool is_derived(int s) const { return s == kDphi || (s == kN && has_chunk()); }

  int64_t derived(int s) {
    if (bound_[s]) return values_[s];
    if (s == kDphi) {
      if (!bound_[kDh]) fail(EXPANSE_ERROR_INTERNAL, "%s: D is needed before d is known", op_.name);
      const expanse_layout l = layout();
      if (l.kind == EXPANSE_LAYOUT_TILED && value(kDh) % l.d_tile != 0)
        error("argument 'layout': tiled layout needs d %% d_tile == 0, got d=%lld, d_tile=%d", (long long)value(kDh),
              l.d_tile);
      const int64_t D = expanded_dim_checked(param_int32(param_check::degree), value(kDh), l);
      if (D < 0)
        error("expanded dimension D overflows int64 for p=%d, d=%lld", param_int32(param_check::degree),
              (long long)value(kDh));
      bind_value(kDphi, D, nullptr);
    } else if (s == kN && has_chunk()) {
      if (!bound_[kT]) fail(EXPANSE_ERROR_INTERNAL, "%s: n is needed before t is known", op_.name);
      bind_value(kN, chunks(value(kT), chunk_length()), nullptr);
    } else {
      fail(EXPANSE_ERROR_INTERNAL, "%s: size %s is not bound by any input", op_.name, kSymbolNames[s]);
    }
    return values_[s];
  }

  // Where an expected size comes from, for messages.
  std::string origin(int s) const {
    if (s == kDphi) return "(the expanded dimension for p, d and layout)";
    if (s == kT && first_omitted_axis_) return "to match '" + std::string(from_[s]) + "' (one token: it has no token axis)";
    if (s == kN && has_chunk()) return "(the number of chunks of chunk_size tokens in t)";
    return "to match '" + std::string(from_[s]) + "'";
  }

  expanse_layout layout() const {
    for (int i = 0; i < op_.param_count; ++i)
      if (op_.params[i].check == param_check::layout) {
        expanse_layout l;
        std::memcpy(&l, args_ + op_.params[i].info.offset, sizeof(l));
        if (l.kind < EXPANSE_LAYOUT_SYMPOW || l.kind > EXPANSE_LAYOUT_TENSOR)
          error("argument 'layout': unknown layout kind %d (expected sympow, tiled or tensor)", l.kind);
        if (l.kind == EXPANSE_LAYOUT_TILED && l.d_tile < 1)
          error("argument 'layout': tiled layout needs d_tile >= 1, got %d", l.d_tile);
        return l;
      }
    return expanse_layout{EXPANSE_LAYOUT_SYMPOW, 0};
  }

  int32_t param_int32(param_check check) const {
    for (int i = 0; i < op_.param_count; ++i)
      if (op_.params[i].check == check) {
        int32_t v;
        std::memcpy(&v, args_ + op_.params[i].info.offset, sizeof(v));
        return v;
      }
    return 0;
  }

  const param_decl* chunk_decl() const {
    for (int i = 0; i < op_.param_count; ++i) {
      const param_check c = op_.params[i].check;
      if (c == param_check::chunk || c == param_check::chunk_or_all || c == param_check::chunk_or_auto)
        return &op_.params[i];
    }
    return nullptr;
  }
  bool has_chunk() const { return chunk_decl() != nullptr; }
  param_check chunk_check() const { return chunk_decl()->check; }
  int64_t chunk_param() const {
    int64_t c;
    std::memcpy(&c, args_ + chunk_decl()->info.offset, sizeof(c));
    return c;
  }
  // The chunk length a problem runs with: a chunk longer than the sequence is one chunk of t tokens
  // (so no size grows with the request: c may be anything up to INT64_MAX); 0 (where allowed) is
  // one chunk too. power_attention's own choice comes later (choose_chunk).
  int64_t chunk_length() const {
    const int64_t t = bound_[kT] ? values_[kT] : 0, c = chunk_param();
    return std::min(c > 0 ? c : t, std::max<int64_t>(t, 1));
  }
  // ceil(t / c) without the overflow of (t + c - 1) / c.
  static int64_t chunks(int64_t t, int64_t c) { return c > 0 ? t / c + (t % c != 0) : 0; }

  const op_decl& op_;
  const parsed_op& parsed_;
  const char* args_;
  const device_requirement* device_;
  int64_t values_[kSymbolCount]{};
  bool bound_[kSymbolCount]{};
  const char* from_[kSymbolCount]{};
  std::vector<int64_t> rest_;
  const char* rest_from_ = nullptr;
  bool rest_bound_ = false;
  const expanse_tensor* first_ = nullptr;
  bool state_seen_ = false;
  bool rule_has_omittable_ = false, first_omitted_axis_ = false, omitted_axis_ = false;
  bool canonical_[kMaxTensorArgs]{};
  expanse_tensor scratch_[kMaxTensorArgs]{};  // full views when there is no validated_op to keep them
};

// Byte range [first, last) of a tensor's elements; empty for a tensor without elements.
struct byte_range {
  uintptr_t first = 0, last = 0;
};

byte_range bytes_of(const expanse_tensor& t) {
  int64_t last_offset = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return {};
    last_offset += t.strides[i] * (t.shape[i] - 1);  // bounded by validation (structure())
  }
  const uintptr_t first = reinterpret_cast<uintptr_t>(t.data);
  return {first, first + static_cast<uintptr_t>(last_offset + 1) * dtype_size_of(t.dtype)};
}

// An output (or in-place argument) shares no memory with any other argument: the library writes
// outputs while it still reads the inputs, and one output's writes would corrupt another's. The
// check is on byte ranges (first to last element), so interleaved views of one buffer are refused
// too, as "may overlap".
void check_no_overlap(const checker& ck, const op_decl& op, const void* args) {
  for (int32_t i = 0; i < op.tensor_count; ++i) {
    const expanse_tensor_arg_info& out = op.tensors[i].info;
    const expanse_tensor* o = tensor_at(args, out);
    if (out.role == EXPANSE_ARG_INPUT || !o) continue;
    const byte_range ro = bytes_of(*o);
    if (ro.first == ro.last) continue;
    for (int32_t j = 0; j < op.tensor_count; ++j) {
      const expanse_tensor_arg_info& other = op.tensors[j].info;
      const expanse_tensor* t = tensor_at(args, other);
      if (j == i || !t || (other.role != EXPANSE_ARG_INPUT && j < i)) continue;  // each pair of outputs once
      const byte_range rt = bytes_of(*t);
      if (rt.first < ro.last && ro.first < rt.last)
        ck.error("argument '%s' overlaps argument '%s' in memory: %s must not share memory with any other "
                 "argument", out.name, other.name, out.role == EXPANSE_ARG_IN_OUT ? "a state updated in place" : "an output");
    }
  }
}

const op_decl& declaration(int32_t kind, const void* args) {
  const op_decl* op = op_declaration(kind);
  if (!op) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "unknown operation kind %d", kind);
  if (!args) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'args' is NULL", op->name);
  static_assert(kMaxArgsSize >= sizeof(expanse_power_attention_backward_args), "room for the largest args struct");
  if (op->args_size > kMaxArgsSize || op->tensor_count > kMaxTensorArgs)
    fail(EXPANSE_ERROR_INTERNAL, "%s: its arguments outgrow validated_op", op->name);
  return *op;
}

}  // namespace

void validate_op(int32_t kind, const void* args, const device_requirement& device, validated_op& out) {
  out = validated_op{};
  out.args = args;
  const op_decl& op = declaration(kind, args);
  checker ck(op, args, &device);
  ck.presence(true);
  expanse_problem& pr = out.problem;
  ck.early_params(pr);
  ck.tensors(true, pr, &out);
  ck.finish(pr);
  ck.choose_chunk(pr, out);
  check_no_overlap(ck, op, args);
}

void output_shape(int32_t kind, const void* args, int32_t arg, int32_t* ndim, int64_t* shape, int32_t* dtype) {
  const op_decl& op = declaration(kind, args);
  if (!ndim || !shape) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_output_shape: arguments 'ndim' and 'shape' are required");
  if (arg < 0 || arg >= op.tensor_count || op.tensors[arg].info.role == EXPANSE_ARG_INPUT)
    fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_output_shape: argument 'arg' (%d) is no output of %s", arg, op.name);
  checker ck(op, args, nullptr);
  ck.presence(false);
  expanse_problem pr{};
  ck.early_params(pr);
  ck.tensors(false, pr, nullptr);
  ck.finish(pr);
  *ndim = ck.shape_of(arg, shape);
  if (dtype) *dtype = ck.default_dtype(arg, pr);
}

}  // namespace expanse::detail

extern "C" EXPANSE_API expanse_status expanse_output_shape(expanse_op_kind op, const void* args, int32_t arg,
                                                           int32_t* ndim, int64_t* shape, int32_t* dtype) {
  using namespace expanse::detail;
  return guarded([&] { output_shape(enum_code(op), args, arg, ndim, shape, dtype); });
}
