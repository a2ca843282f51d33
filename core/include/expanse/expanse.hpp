// expanse: header-only C++ wrapper over the C ABI of libexpanse.so.
//
//   expanse::context ctx("reference");                   // or ctx("") for $EXPANSE_BACKEND
//   std::vector<float> q(b*t*h*d), k(...), v(...), o(b*t*h*e);
//   auto a = expanse::power_attention_args();
//   expanse_tensor tq = expanse::tensor(q.data(), {b, t, h, d}), ...;
//   a.q = &tq; a.k = &tk; a.v = &tv; a.o = &to; a.p = 2; a.chunk_size = 128;
//   ctx.power_attention(a);                              // throws expanse::error on failure
//
// RAII handles own contexts and device buffers; failures throw expanse::error carrying the status
// and the library's message (which names the offending argument).
#ifndef EXPANSE_EXPANSE_HPP
#define EXPANSE_EXPANSE_HPP

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "expanse/expanse.h"

namespace expanse {

class error : public std::runtime_error {
 public:
  error(expanse_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  expanse_status status() const noexcept { return status_; }

 private:
  expanse_status status_;
};

inline void check(expanse_status status) {
  if (status != EXPANSE_OK) throw error(status, expanse_last_error());
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr expanse_dtype value = EXPANSE_F32; };
template <> struct dtype_of<double> { static constexpr expanse_dtype value = EXPANSE_F64; };

// A contiguous tensor view over typed memory (float or double; use tensor_of for f16/bf16 bytes).
template <class T>
expanse_tensor tensor(T* data, std::initializer_list<int64_t> shape,
                      expanse_device_type device_type = EXPANSE_DEVICE_CPU, int32_t device_id = 0) {
  expanse_tensor t;
  std::vector<int64_t> s(shape);
  check(expanse_tensor_make(&t, const_cast<void*>(static_cast<const void*>(data)), dtype_of<std::remove_const_t<T>>::value,
                            static_cast<int32_t>(s.size()), s.data(), device_type, device_id));
  return t;
}

inline expanse_tensor tensor_of(void* data, expanse_dtype dtype, const std::vector<int64_t>& shape,
                                expanse_device_type device_type = EXPANSE_DEVICE_CPU, int32_t device_id = 0) {
  expanse_tensor t;
  check(expanse_tensor_make(&t, data, dtype, static_cast<int32_t>(shape.size()), shape.data(), device_type, device_id));
  return t;
}

inline int64_t expanded_dim(int32_t p, int64_t d, expanse_layout layout = {EXPANSE_LAYOUT_SYMPOW, 0}) {
  int64_t D = 0;
  check(expanse_expanded_dim(p, d, layout, &D));
  return D;
}

// The operation kind of an args struct: op_kind_of<expanse_power_attention_args>, ...
template <class Args>
struct op_kind_of;
#define EXPANSE_OP_KIND_OF(name, NAME)                                                    \
  template <>                                                                             \
  struct op_kind_of<expanse_##name##_args> {                                              \
    static constexpr expanse_op_kind value = EXPANSE_OP_##NAME;                           \
  };
EXPANSE_OPERATIONS(EXPANSE_OP_KIND_OF)
#undef EXPANSE_OP_KIND_OF

// The kinds by operation name: expanse::ops::power_attention, ...
namespace ops {
#define EXPANSE_OP_CONSTANT(name, NAME) constexpr expanse_op_kind name = op_kind_of<expanse_##name##_args>::value;
EXPANSE_OPERATIONS(EXPANSE_OP_CONSTANT)
#undef EXPANSE_OP_CONSTANT
}  // namespace ops

// An operation's tables (expanse_op_tensor_args, expanse_op_params) as vectors.
inline std::vector<expanse_tensor_arg_info> tensor_args(expanse_op_kind op) {
  const expanse_tensor_arg_info* t = nullptr;
  const int32_t n = expanse_op_tensor_args(op, &t);
  if (n < 0) throw error(EXPANSE_ERROR_INVALID_ARGUMENT, "unknown operation kind " + std::to_string(int(op)));
  return {t, t + n};
}
inline std::vector<expanse_param_info> params(expanse_op_kind op) {
  const expanse_param_info* p = nullptr;
  const int32_t n = expanse_op_params(op, &p);
  if (n < 0) throw error(EXPANSE_ERROR_INVALID_ARGUMENT, "unknown operation kind " + std::to_string(int(op)));
  return {p, p + n};
}

// Argument structs with the library's defaults.
#define EXPANSE_ARGS_FACTORY(name, NAME)                  \
  inline expanse_##name##_args name##_args() {            \
    expanse_##name##_args a;                              \
    expanse_##name##_args_init(&a);                       \
    return a;                                             \
  }
EXPANSE_OPERATIONS(EXPANSE_ARGS_FACTORY)
#undef EXPANSE_ARGS_FACTORY

inline std::vector<expanse_backend_info> backends() {
  std::vector<expanse_backend_info> list(static_cast<size_t>(expanse_backend_count()));
  for (size_t i = 0; i < list.size(); ++i) check(expanse_backend_get_info(static_cast<int32_t>(i), &list[i]));
  return list;
}

class context;

// Memory on a context's device, freed on destruction.
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(expanse_context* ctx, size_t bytes) : ctx_(ctx), bytes_(bytes) {
    check(expanse_malloc(ctx_, bytes, &ptr_));
  }
  device_buffer(device_buffer&& o) noexcept { swap(o); }
  device_buffer& operator=(device_buffer&& o) noexcept {
    device_buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (ptr_) expanse_free(ctx_, ptr_);
  }
  void* data() const noexcept { return ptr_; }
  size_t size() const noexcept { return bytes_; }
  // Takes ownership of memory from expanse_malloc on ctx.
  static device_buffer adopt(expanse_context* ctx, void* ptr, size_t bytes) noexcept {
    device_buffer b;
    b.ctx_ = ctx, b.ptr_ = ptr, b.bytes_ = bytes;
    return b;
  }

 private:
  void swap(device_buffer& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  expanse_context* ctx_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A backend, a device, a stream and a workspace. Move-only.
class context {
 public:
  explicit context(const std::string& backend = "", int32_t device = 0) : device_(device) {
    check(expanse_context_create(backend.c_str(), device, &ctx_));
    workspace_ = std::make_unique<owned_workspace>();
    workspace_->ctx = ctx_;
    check(expanse_context_set_allocator(ctx_, &owned_workspace::grow, workspace_.get()));
  }
  context(context&& o) noexcept
      : ctx_(std::exchange(o.ctx_, nullptr)), device_(o.device_), workspace_(std::move(o.workspace_)) {}
  context& operator=(context&& o) noexcept {
    if (this != &o) {
      workspace_.reset();
      expanse_context_destroy(ctx_);
      ctx_ = std::exchange(o.ctx_, nullptr);
      device_ = o.device_;
      workspace_ = std::move(o.workspace_);
    }
    return *this;
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() {
    workspace_.reset();
    expanse_context_destroy(ctx_);
  }

  expanse_context* get() const noexcept { return ctx_; }
  std::string backend() const { return expanse_context_backend(ctx_); }
  expanse_device_type device_type() const { return expanse_device_type(expanse_context_device_type(ctx_)); }
  int32_t device() const noexcept { return device_; }  // the device index it was created on
  void set_stream(void* stream) { check(expanse_context_set_stream(ctx_, stream)); }
  // Refuse NaN and infinities in inputs, naming the argument and index (expanse_context_set_check_finite).
  void set_check_finite(bool enabled) { check(expanse_context_set_check_finite(ctx_, enabled ? 1 : 0)); }
  // Use caller-owned scratch memory; run() then allocates only for an op that needs more.
  void set_workspace(void* workspace, size_t bytes) { check(expanse_context_set_workspace(ctx_, workspace, bytes)); }

  bool supports(expanse_op_kind op, const void* args, std::string* reason = nullptr) const {
    char text[512] = {0};
    const expanse_status st = expanse_supports(ctx_, op, args, text, sizeof(text));
    if (st == EXPANSE_ERROR_UNSUPPORTED) {
      if (reason) *reason = text;
      return false;
    }
    check(st);
    return true;
  }
  size_t workspace_size(expanse_op_kind op, const void* args) const {
    size_t bytes = 0;
    check(expanse_workspace_size(ctx_, op, args, &bytes));
    return bytes;
  }
  // Runs op (one validation); for convenience grows an owned workspace when the op needs more than
  // the context has (the context's allocator, set at construction).
  void run(expanse_op_kind op, const void* args) { check(expanse_run(ctx_, op, args)); }

  // sympow_expand(args), update_state(args), ...: one method per operation.
#define EXPANSE_CONTEXT_METHOD(name, NAME) \
  void name(const expanse_##name##_args& a) { run(EXPANSE_OP_##NAME, &a); }
  EXPANSE_OPERATIONS(EXPANSE_CONTEXT_METHOD)
#undef EXPANSE_CONTEXT_METHOD

  device_buffer allocate(size_t bytes) { return device_buffer(ctx_, bytes); }
  void copy(void* dst, const void* src, size_t bytes, expanse_copy_kind kind) {
    check(expanse_memcpy(ctx_, dst, src, bytes, kind));
  }
  void synchronize() { check(expanse_synchronize(ctx_)); }

 private:
  expanse_context* ctx_ = nullptr;
  int32_t device_ = 0;
  // The workspace this wrapper owns: the context's allocator (expanse_context_set_allocator) grows it
  // to the largest an op has asked for. On the heap, so that its address survives a move.
  struct owned_workspace {
    expanse_context* ctx = nullptr;
    device_buffer buffer;
    static void* grow(void* self, size_t bytes) noexcept {
      auto& w = *static_cast<owned_workspace*>(self);
      if (bytes > w.buffer.size()) {
        w.buffer = device_buffer();
        void* ptr = nullptr;
        if (expanse_malloc(w.ctx, bytes, &ptr) != EXPANSE_OK) return nullptr;
        w.buffer = device_buffer::adopt(w.ctx, ptr, bytes);
      }
      return w.buffer.data();
    }
  };
  std::unique_ptr<owned_workspace> workspace_;
};

}  // namespace expanse

#endif  // EXPANSE_EXPANSE_HPP
