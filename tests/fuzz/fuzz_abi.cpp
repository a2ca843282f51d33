// libFuzzer harness for the C ABI: one operation per input, its descriptors built from the fuzz
// bytes over host buffers that really hold every declared tensor, run on a reference context.
// Checked (docs/spec.md, "Bad input"): no crash or sanitizer report; the status is an
// expanse_status value; a failure comes with a non-empty expanse_last_error(); a rejected call
// writes nothing; an accepted one writes nothing outside its outputs' byte ranges (first to last
// element), and is never one whose output shares memory with another argument.
//
// Input format (little endian; reading past the end gives zeros, so any byte string is an input;
// tests/fuzz/make_corpus.py writes inputs from a readable description):
//
//   u8   op          % 16 (EXPANSE_OP_COUNT and above: an unknown operation)
//   u8   flags       bit 0: pass args = NULL; bit 1: also call expanse_supports/expanse_workspace_size;
//                    bit 2: run with the opt-in check of finite inputs (expanse_context_set_check_finite)
//   INT  p, INT chunk_size, F64 scale, INT normalize, INT layout.kind, INT layout.d_tile
//                    (the fields the op has; the others are read and ignored)
//   then for each tensor argument of the op, in the order of expanse_op_tensor_args:
//   u8   mode        % 4: 0 NULL pointer, 1 own buffer, 2 data = NULL, 3 the buffer of an earlier
//                    argument (u8 index follows; that buffer is enlarged to hold both: overlap)
//   INT  dtype, INT device_type - 1 (0 means CPU), INT device_id, INT ndim
//   u8   strides     0: contiguous, else explicit (one INT per dimension after the shape)
//   INT  shape[min(max(ndim, 0), 8)], [INT strides[...]]
//   u8   byte offset of data in its buffer (misaligned values are for the library to reject)
//   u8   fill        0 zeros, 1 uniform in [-1, 1), 2 log decays in (-1, 0], 3 values of +-1e4,
//                    4 every element the special value
//   u8   special     0 none, 1 -inf, 2 +inf, 3 NaN, 4 1e300, 5 -1e300, 6 raw F64 follows, 7 0.0
//   INT  index       of the element set to the special value (modulo the element count)
//
//   INT: u8 b < 0xE0: b; 0xE0: raw i64 follows; 0xE1: INT64_MAX; 0xE2: INT64_MIN; 0xE3: -1;
//        0xE4: INT64_MAX - u8; 0xE5: INT32_MAX; 0xE6: INT32_MIN; 0xE7: 1 << (u8 % 63);
//        0xE8..0xFF: -2 .. -25. Narrower fields take the low bits (two's complement).
//   F64: u8 0: 0.0; 1: raw f64 follows; 2: NaN; 3: +inf; 4: -inf; 5: 1e308; else (b - 128) / 16.
//
// EXPANSE_FUZZ_VERBOSE=1 prints each run's op, status and error text (to see what a corpus file
// exercises: `EXPANSE_FUZZ_VERBOSE=1 fuzz_abi corpus/fuzz_abi/known-*`).
//
// Sizes: a tensor whose element count or last byte offset does not fit in int64 cannot exist; it
// gets a small buffer and the library must reject it (so does one whose rank is not in 0..8). Any other tensor that needs more than
// kMaxTensorElements elements or kMaxTensorBytes bytes is shrunk (its largest dimension halved
// until it fits), so every run stays small and fast; buffers are allocated at their exact size so
// that AddressSanitizer sees any access past them.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "expanse/expanse.h"

namespace {

constexpr int64_t kMaxTensorElements = 8192;
constexpr int64_t kMaxTensorBytes = 1 << 16;

// ---------------------------------------------------------------- the operations' arguments
// Everything about an op's arguments comes from the library's own tables: its tensors
// (expanse_op_tensor_args), its parameters (expanse_op_params: the fuzzed scalars go to the fields of
// these names) and their defaults (expanse_op_args_init).

// Writes the fuzzed scalars into the parameters of the op that has them.
void set_params(expanse_op_kind op, char* args, int32_t p, int64_t chunk_size, double scale, int32_t normalize,
                const expanse_layout& layout) {
  const expanse_param_info* params = nullptr;
  const int32_t count = expanse_op_params(op, &params);
  for (int32_t i = 0; i < count; ++i) {
    const std::string name = params[i].name;
    char* at = args + params[i].offset;
    if (name == "p") std::memcpy(at, &p, sizeof(p));
    else if (name == "chunk_size") std::memcpy(at, &chunk_size, sizeof(chunk_size));
    else if (name == "scale") std::memcpy(at, &scale, sizeof(scale));
    else if (name == "normalize") std::memcpy(at, &normalize, sizeof(normalize));
    else if (name == "layout") std::memcpy(at, &layout, sizeof(layout));
    else std::abort();  // a parameter this harness does not fuzz yet: extend the input format
  }
}

// ---------------------------------------------------------------- reading the input

class reader {
 public:
  reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  int64_t raw64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(u8()) << (8 * i);
    int64_t s;
    std::memcpy(&s, &v, 8);
    return s;
  }
  int64_t integer() {
    const uint8_t b = u8();
    if (b < 0xE0) return b;
    switch (b) {
      case 0xE0: return raw64();
      case 0xE1: return INT64_MAX;
      case 0xE2: return INT64_MIN;
      case 0xE3: return -1;
      case 0xE4: return INT64_MAX - u8();
      case 0xE5: return INT32_MAX;
      case 0xE6: return INT32_MIN;
      case 0xE7: return int64_t(1) << (u8() % 63);
      default: return -2 - int64_t(b - 0xE8);
    }
  }
  int32_t int32() {
    const uint64_t v = static_cast<uint64_t>(integer());
    return static_cast<int32_t>(static_cast<uint32_t>(v));  // the low 32 bits
  }
  double f64() {
    const uint8_t b = u8();
    switch (b) {
      case 0: return 0.0;
      case 1: {
        const int64_t bits = raw64();
        double d;
        std::memcpy(&d, &bits, 8);
        return d;
      }
      case 2: return std::numeric_limits<double>::quiet_NaN();
      case 3: return std::numeric_limits<double>::infinity();
      case 4: return -std::numeric_limits<double>::infinity();
      case 5: return 1e308;
      default: return (int(b) - 128) / 16.0;
    }
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// ---------------------------------------------------------------- tensors and their buffers

size_t elem_size(int32_t dtype) {
  const size_t s = expanse_dtype_size(static_cast<expanse_dtype>(dtype & 3));
  return (dtype >= 0 && dtype <= 3) ? s : 8;  // unknown dtypes: room for the widest
}

struct span_info {
  bool impossible;  // element count or last byte offset beyond int64: the library must reject it
  __int128 elements;
  __int128 bytes;  // bytes from the first element to the end of the last one (0 when empty)
};

span_info span_of(const expanse_tensor& t) {
  const int nd = t.ndim < 0 ? 0 : t.ndim > EXPANSE_MAX_DIMS ? EXPANSE_MAX_DIMS : t.ndim;
  span_info s{false, 1, 0};
  __int128 last = 0;
  bool empty = false;
  for (int i = 0; i < nd; ++i) {
    const __int128 extent = t.shape[i] < 0 ? 0 : t.shape[i];  // negative: rejected, needs nothing
    if (extent == 0) empty = true;
    if (!empty && s.elements > INT64_MAX) continue;  // already impossible; avoid __int128 overflow
    s.elements *= extent;
    if (extent > 0 && t.strides[i] > 0) {  // saturates at 2^100, far above int64 and far below overflow
      const __int128 cap = static_cast<__int128>(1) << 100;
      last = std::min(cap, last + std::min(cap, static_cast<__int128>(t.strides[i]) * (extent - 1)));
    }
  }
  if (empty) return {false, 0, 0};
  const __int128 es = static_cast<__int128>(elem_size(t.dtype));
  s.impossible = s.elements > INT64_MAX || last * es > INT64_MAX;
  s.bytes = s.impossible ? 0 : (last + 1) * es;
  return s;
}

bool too_big(const span_info& s) { return s.elements > kMaxTensorElements || s.bytes > kMaxTensorBytes; }

// Halves the largest dimension until the tensor fits (contiguous strides are recomputed).
void shrink(expanse_tensor& t, bool contiguous) {
  const int nd = t.ndim;
  while (too_big(span_of(t))) {
    int largest = 0;
    for (int i = 1; i < nd; ++i)
      if (t.shape[i] > t.shape[largest]) largest = i;
    t.shape[largest] /= 2;
    if (contiguous) {
      int64_t stride = 1;
      for (int i = nd - 1; i >= 0; --i) {
        t.strides[i] = stride;
        stride *= t.shape[i] > 0 ? t.shape[i] : 1;
      }
    }
  }
}

// Deterministic values for one tensor (no global state: inputs replay exactly).
struct lcg {
  uint64_t s;
  double uniform() {  // [-1, 1)
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) / 4503599627370496.0 - 1.0;
  }
};

uint16_t to_f16(double v) {  // rounds toward zero, enough for fuzz values (inf, nan, overflow)
  if (std::isnan(v)) return 0x7e00;
  if (std::isinf(v)) return v > 0 ? 0x7c00 : 0xfc00;
  const float f = static_cast<float>(std::fmax(-1e38, std::fmin(1e38, v)));
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const int exp = int((x >> 23) & 0xff) - 127 + 15;
  if (exp >= 31) return sign | 0x7c00;
  if (exp <= 0) return sign;
  return static_cast<uint16_t>(sign | (exp << 10) | ((x >> 13) & 0x3ff));
}

void store(void* base, int32_t dtype, int64_t offset, double v) {
  char* p = static_cast<char*>(base);
  switch (dtype) {
    case EXPANSE_F16: {
      const uint16_t h = to_f16(v);
      std::memcpy(p + 2 * offset, &h, 2);
      break;
    }
    case EXPANSE_BF16: {
      float f = std::isfinite(v) ? static_cast<float>(std::fmax(-3e38, std::fmin(3e38, v))) : static_cast<float>(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      const uint16_t h = static_cast<uint16_t>(x >> 16);
      std::memcpy(p + 2 * offset, &h, 2);
      break;
    }
    case EXPANSE_F32: {
      const float f = std::isfinite(v) ? static_cast<float>(std::fmax(-3e38, std::fmin(3e38, v))) : static_cast<float>(v);
      std::memcpy(p + 4 * offset, &f, 4);
      break;
    }
    default: std::memcpy(p + 8 * offset, &v, 8); break;
  }
}

// Calls f(element offset) for every element of t, in order (none when t has a negative dimension
// or stride: the library rejects those, and span_of gave them no room).
template <class F>
void for_each_offset(const expanse_tensor& t, const F& f) {
  int64_t index[EXPANSE_MAX_DIMS] = {0};
  const int nd = t.ndim;
  for (int i = 0; i < nd; ++i)
    if (t.shape[i] <= 0 || t.strides[i] < 0) return;
  while (true) {
    int64_t off = 0;
    for (int i = 0; i < nd; ++i) off += index[i] * t.strides[i];
    f(off);
    int i = nd - 1;
    for (; i >= 0; --i) {
      if (++index[i] < t.shape[i]) break;
      index[i] = 0;
    }
    if (i < 0) return;
  }
}

struct tensor_arg {
  int mode = 0;  // 0 NULL, 1 own buffer, 2 data NULL, 3 alias
  int alias = 0;
  bool contiguous = true;
  bool impossible = false;
  unsigned offset = 0;  // bytes
  int fill = 0, special = 0;
  double special_value = 0;
  int64_t special_index = 0;
  expanse_tensor t{};
  size_t need = 0;  // bytes of buffer from its start
};

double special_of(int code, double raw) {
  switch (code) {
    case 1: return -INFINITY;
    case 2: return INFINITY;
    case 3: return NAN;
    case 4: return 1e300;
    case 5: return -1e300;
    case 6: return raw;
    case 7: return 0.0;
    default: return 0.0;
  }
}

bool known_status(expanse_status st) {
  switch (static_cast<int>(st)) {
    case EXPANSE_OK: case EXPANSE_ERROR_INVALID_ARGUMENT: case EXPANSE_ERROR_UNSUPPORTED:
    case EXPANSE_ERROR_BACKEND: case EXPANSE_ERROR_OUT_OF_MEMORY: case EXPANSE_ERROR_WORKSPACE:
    case EXPANSE_ERROR_INTERNAL:
      return true;
    default: return false;
  }
}

void check_status(const char* call, int op, expanse_status st) {
  static const bool verbose = [] {
    const char* v = std::getenv("EXPANSE_FUZZ_VERBOSE");
    return v && *v && *v != '0';
  }();
  if (verbose)
    std::fprintf(stderr, "fuzz_abi: %s(%s) -> %s: %s\n", call, expanse_op_name(static_cast<expanse_op_kind>(op)),
                 expanse_status_name(st), expanse_last_error());
  if (!known_status(st)) {
    std::fprintf(stderr, "fuzz_abi: %s(op %d) returned %d, not an expanse_status value\n", call, op, int(st));
    std::abort();
  }
  const char* err = expanse_last_error();
  if (st != EXPANSE_OK && (err == nullptr || err[0] == '\0')) {
    std::fprintf(stderr, "fuzz_abi: %s(op %d) failed with status %d (%s) but expanse_last_error() is empty\n",
                 call, op, int(st), expanse_status_name(st));
    std::abort();
  }
}

expanse_context* reference_context() {
  static expanse_context* ctx = [] {
    expanse_context* c = nullptr;
    if (expanse_context_create("reference", 0, &c) != EXPANSE_OK) {
      std::fprintf(stderr, "fuzz_abi: no reference context: %s\n", expanse_last_error());
      std::abort();
    }
    return c;
  }();
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  reader in(data, size);
  const int op = in.u8() % 16;
  const uint8_t flags = in.u8();
  const int32_t p = in.int32();
  const int64_t chunk_size = in.integer();
  const double scale = in.f64();
  const int32_t normalize = in.int32();
  expanse_layout layout;
  layout.kind = in.int32();
  layout.d_tile = in.int32();

  expanse_context* ctx = reference_context();
  if (op >= EXPANSE_OP_COUNT) {  // an unknown operation, with or without arguments
    alignas(16) char dummy[512] = {0};
    const expanse_status st = expanse_run(ctx, static_cast<expanse_op_kind>(op), (flags & 1) ? nullptr : dummy);
    check_status("expanse_run", op, st);
    if (st == EXPANSE_OK) std::abort();
    return 0;
  }

  const auto kind = static_cast<expanse_op_kind>(op);
  const expanse_tensor_arg_info* infos = nullptr;
  const int32_t count = expanse_op_tensor_args(kind, &infos);
  const size_t args_size = expanse_op_args_size(kind);
  if (count < 0 || !infos || args_size == 0) {
    std::fprintf(stderr, "fuzz_abi: no tensor table for op %d\n", op);
    std::abort();
  }
  const size_t n = static_cast<size_t>(count);
  std::vector<tensor_arg> args(n);
  for (size_t i = 0; i < n; ++i) {
    tensor_arg& a = args[i];
    a.mode = in.u8() % 4;
    if (a.mode == 3) {
      a.alias = i == 0 ? -1 : static_cast<int>(in.u8() % i);
      if (a.alias < 0) a.mode = 1;  // nothing earlier to share
    }
    if (a.mode == 0) continue;
    a.t.dtype = in.int32();
    a.t.device_type = static_cast<int32_t>(static_cast<uint32_t>(in.int32()) + 1u);
    a.t.device_id = in.int32();
    a.t.ndim = in.int32();
    a.contiguous = in.u8() == 0;
    const int nd = a.t.ndim < 0 ? 0 : a.t.ndim > EXPANSE_MAX_DIMS ? EXPANSE_MAX_DIMS : a.t.ndim;
    for (int d = 0; d < nd; ++d) a.t.shape[d] = in.integer();
    if (a.contiguous) {
      int64_t stride = 1;
      for (int d = nd - 1; d >= 0; --d) {
        a.t.strides[d] = stride;
        const int64_t extent = a.t.shape[d] > 0 ? a.t.shape[d] : 1;
        stride = stride > INT64_MAX / extent ? INT64_MAX : stride * extent;  // saturate: overflow is rejected
      }
    } else {
      for (int d = 0; d < nd; ++d) a.t.strides[d] = in.integer();
    }
    a.offset = in.u8();
    a.fill = in.u8();
    a.special = in.u8();
    a.special_value = a.special == 6 ? in.f64() : 0.0;
    a.special_index = in.integer();

    span_info s = span_of(a.t);
    // A rank outside 0..EXPANSE_MAX_DIMS must be rejected too: its shape is not even read.
    a.impossible = s.impossible || a.t.ndim < 0 || a.t.ndim > EXPANSE_MAX_DIMS;
    if (!a.impossible && too_big(s)) {
      shrink(a.t, a.contiguous);
      s = span_of(a.t);
    }
    a.need = a.offset + (a.impossible ? 64 : static_cast<size_t>(s.bytes));
  }

  // Buffers: one per argument of mode 1 and 3 (an alias enlarges the buffer it shares), exactly
  // as large as needed.
  std::vector<int> root(n);
  std::vector<size_t> bytes(n, 0);
  for (size_t i = 0; i < n; ++i) {
    root[i] = args[i].mode == 3 ? root[args[i].alias] : static_cast<int>(i);
    if (args[i].mode == 1 || args[i].mode == 3) bytes[root[i]] = std::max({bytes[root[i]], args[i].need, size_t(1)});
  }
  std::vector<std::unique_ptr<char[]>> buffers(n);
  for (size_t i = 0; i < n; ++i)
    if (bytes[i] > 0) {
      buffers[i].reset(new char[bytes[i]]);
      std::memset(buffers[i].get(), 0, bytes[i]);
    }
  for (size_t i = 0; i < n; ++i) {
    tensor_arg& a = args[i];
    if (a.mode == 2) a.t.data = nullptr;
    if (a.mode == 1 || a.mode == 3) {
      char* base = buffers[root[i]].get();
      a.t.data = base ? base + a.offset : nullptr;
      if (base && !a.impossible && a.t.ndim >= 0 && a.t.ndim <= EXPANSE_MAX_DIMS &&
          a.t.dtype >= 0 && a.t.dtype <= 3 && reinterpret_cast<uintptr_t>(a.t.data) % elem_size(a.t.dtype) == 0) {
        lcg rng{0x9e3779b97f4a7c15ull ^ (uint64_t(i) << 32) ^ uint64_t(a.fill)};
        const double special = special_of(a.special, a.special_value);
        const int64_t count = static_cast<int64_t>(span_of(a.t).elements);
        const int64_t at = count > 0 ? static_cast<int64_t>(static_cast<uint64_t>(a.special_index) % uint64_t(count)) : 0;
        int64_t k = 0;
        for_each_offset(a.t, [&](int64_t off) {
          double v = 0.0;
          switch (a.fill) {
            case 1: v = rng.uniform(); break;
            case 2: v = -0.5 * (rng.uniform() + 1.0); break;
            case 3: v = rng.uniform() < 0 ? -1e4 : 1e4; break;
            case 4: v = special; break;
            default: break;
          }
          if (a.special != 0 && k == at) v = special;
          store(a.t.data, a.t.dtype, off, v);
          ++k;
        });
      }
    }
  }

  // The args struct, on the heap at exactly its size (AddressSanitizer sees a read past it):
  // defaults from the op's _init, then the fuzzed fields.
  std::unique_ptr<char[]> args_struct(new char[args_size]);
  char* storage = args_struct.get();
  if (expanse_op_args_init(kind, storage) != EXPANSE_OK) std::abort();
  for (size_t i = 0; i < n; ++i) {
    expanse_tensor* ptr = args[i].mode == 0 ? nullptr : &args[i].t;
    std::memcpy(storage + infos[i].offset, &ptr, sizeof(ptr));
  }
  set_params(kind, storage, p, chunk_size, scale, normalize, layout);

  // The reference computes power_attention without given states through a D x e state: skip
  // problems whose expanded dimension alone would make one run take seconds (no tensor of the
  // input holds D, so the caps above do not bound it).
  if (op == EXPANSE_OP_POWER_ATTENTION && args[0].mode != 0 && args[0].t.ndim == 4) {
    int64_t D = 0;
    if (expanse_expanded_dim(p, args[0].t.shape[3], layout, &D) == EXPANSE_OK && D > (1 << 16)) return 0;
  }

  const void* a = (flags & 1) ? nullptr : storage;
  if (expanse_context_set_check_finite(ctx, (flags & 4) ? 1 : 0) != EXPANSE_OK) {
    std::fprintf(stderr, "fuzz_abi: expanse_context_set_check_finite failed: %s\n", expanse_last_error());
    std::abort();
  }
  if (flags & 2) {
    char reason[64];
    check_status("expanse_supports", op, expanse_supports(ctx, kind, a, reason, sizeof(reason)));
    size_t ws = 0;
    check_status("expanse_workspace_size", op, expanse_workspace_size(ctx, kind, a, &ws));
  }

  // Every byte of every buffer, to compare after the run.
  std::vector<std::vector<char>> before(n);
  for (size_t i = 0; i < n; ++i)
    if (buffers[i]) before[i].assign(buffers[i].get(), buffers[i].get() + bytes[i]);

  const expanse_status st = expanse_run(ctx, kind, a);
  check_status("expanse_run", op, st);

  // Byte ranges [first, end) of the non-empty tensors in their buffer.
  struct range {
    int root;
    size_t first, end;
  };
  std::vector<range> ranges(n, range{-1, 0, 0});
  for (size_t i = 0; i < n; ++i) {
    const tensor_arg& t = args[i];
    if ((t.mode != 1 && t.mode != 3) || t.impossible || !buffers[root[i]]) continue;
    const span_info s = span_of(t.t);
    if (s.elements > 0) ranges[i] = {root[i], t.offset, t.offset + static_cast<size_t>(s.bytes)};
  }
  auto is_output = [&](size_t i) { return infos[i].role != EXPANSE_ARG_INPUT; };
  const bool rejected = st == EXPANSE_ERROR_INVALID_ARGUMENT || st == EXPANSE_ERROR_UNSUPPORTED ||
                        st == EXPANSE_ERROR_WORKSPACE || st == EXPANSE_ERROR_BACKEND;
  if (st == EXPANSE_OK) {
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j)
        if (i != j && is_output(i) && ranges[i].root >= 0 && ranges[i].root == ranges[j].root &&
            ranges[i].first < ranges[j].end && ranges[j].first < ranges[i].end) {
          std::fprintf(stderr, "fuzz_abi: %s accepted output '%s' sharing memory with '%s'\n",
                       expanse_op_name(kind), infos[i].name, infos[j].name);
          std::abort();
        }
  }
  if (rejected || st == EXPANSE_OK) {
    for (size_t b = 0; b < n; ++b) {
      if (!buffers[b]) continue;
      for (size_t k = 0; k < bytes[b]; ++k) {
        if (buffers[b][k] == before[b][k]) continue;
        const char* owner = nullptr;  // an output whose range holds byte k
        for (size_t i = 0; i < n && !owner; ++i)
          if (is_output(i) && ranges[i].root == static_cast<int>(b) && ranges[i].first <= k && k < ranges[i].end)
            owner = infos[i].name;
        if (rejected || !owner) {
          std::fprintf(stderr, "fuzz_abi: %s (%s) wrote byte %zu of the buffer of '%s'%s\n", expanse_op_name(kind),
                       expanse_status_name(st), k, infos[b].name,
                       rejected ? " although it rejected the call" : ", outside every output");
          std::abort();
        }
      }
    }
  }
  return 0;
}
