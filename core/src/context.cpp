// Contexts and dispatch: API -> validation -> the context's backend (supports, workspace, run).
#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "codes.hpp"
#include "context_stream.hpp"
#include "errors.hpp"
#include "expanse/backend.h"
#include "finite_check.hpp"
#include "op_table.hpp"
#include "expanse/expanse.hpp"
#include "registry.hpp"
#include "validate.hpp"

using namespace expanse::detail;

struct expanse_context {
  const backend_entry* backend = nullptr;
  int32_t device = 0;
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool check_finite = false;
  expanse_allocate_fn allocate = nullptr;  // workspace for a call when `workspace` is too small
  void* allocate_user = nullptr;
  expanse_choose_chunk_size_fn choose_chunk_size = nullptr;  // the backend's rule for EXPANSE_CHUNK_AUTO
};

void* expanse::detail::context_stream(const expanse_context* ctx) { return ctx->stream; }

namespace {

std::string known_backends() {
  std::string s;
  for (const backend_entry& b : backends())
    s += (s.empty() ? "" : ", ") + b.name + (b.available() ? "" : " (unavailable)");
  return s;
}

expanse_context& checked(expanse_context* ctx) {
  if (!ctx) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "argument 'ctx' is NULL");
  return *ctx;
}

const expanse_backend& table_of(const expanse_context& ctx) { return *ctx.backend->table; }

int64_t default_chunk_size(const expanse_problem* problem) { return expanse_auto_chunk_size(problem->t); }

// What validation needs of the context: where tensors must live, and the backend's chunk rule.
device_requirement requirement_of(const expanse_context& ctx) {
  return {table_of(ctx).device_type, ctx.device, ctx.choose_chunk_size};
}

void backend_call(const expanse_context& ctx, const char* what, expanse_status st, const char* err);

// The caller's tensors as host bytes, for the finite check on a device backend.
std::vector<unsigned char> fetch_to_host(const expanse_context& ctx, const void* device_ptr, size_t bytes) {
  std::vector<unsigned char> host(bytes);
  char err[512] = {0};
  expanse_status st = table_of(ctx).memory_copy(ctx.device, host.data(), device_ptr, bytes,
                                                EXPANSE_COPY_DEVICE_TO_HOST, ctx.stream, err, sizeof(err));
  if (st == EXPANSE_OK) st = table_of(ctx).synchronize(ctx.device, ctx.stream, err, sizeof(err));
  err[sizeof(err) - 1] = '\0';
  backend_call(ctx, "finite check: copy of an input to the host", st, err);
  return host;
}

// The finite check (when on) of a validated op's inputs, before it runs.
void check_values(expanse_context& ctx, const expanse_op& op, const void* args) {
  if (!ctx.check_finite) return;
  const char* name = expanse_op_name(op.kind);
  if (table_of(ctx).device_type == EXPANSE_DEVICE_CPU) {
    check_finite_inputs(name, *op_declaration(op.kind), args, nullptr);
  } else {
    const fetch_fn fetch = [&](const void* ptr, size_t bytes) { return fetch_to_host(ctx, ptr, bytes); };
    check_finite_inputs(name, *op_declaration(op.kind), args, &fetch);
  }
}

// Validates args for ctx's device and asks the backend whether it implements the problem (reading
// no tensor's data). `kind` is the caller's integer code.
void prepare(expanse_context& ctx, int32_t kind, const void* args, validated_op& v, expanse_op& op) {
  validate_op(kind, args, requirement_of(ctx), v);
  op.kind = static_cast<expanse_op_kind>(kind);
  op.args = v.args;
  op.problem = &v.problem;
  op.memo = v.memo;
  char reason[512] = {0};
  if (table_of(ctx).supports(&op, reason, sizeof(reason)) != EXPANSE_OK) {
    reason[sizeof(reason) - 1] = '\0';
    fail(EXPANSE_ERROR_UNSUPPORTED, "%s: backend '%s' does not support this problem: %s", expanse_op_name(op.kind),
         ctx.backend->name.c_str(), reason[0] ? reason : "no reason given");
  }
}

void backend_call(const expanse_context& ctx, const char* what, expanse_status st, const char* err) {
  if (st == EXPANSE_OK) return;
  fail(st == EXPANSE_ERROR_UNSUPPORTED || st == EXPANSE_ERROR_OUT_OF_MEMORY ? st : EXPANSE_ERROR_INTERNAL,
       "%s on backend '%s' failed: %s", what, ctx.backend->name.c_str(), err && *err ? err : expanse_status_name(st));
}

// Validates args, checks the values of its inputs where the context asks (those of checked_args:
// args, or a copy without what the call fills in later), takes the workspace and hands the op to
// `launch` (the backend's run, or an extra of its table that takes the same op and exec).
template <class Launch>
void run_op(expanse_context& c, int32_t kind, const void* args, const void* checked_args, Launch&& launch) {
  validated_op v;
  expanse_op op{};
  prepare(c, kind, args, v, op);
  check_values(c, op, checked_args);
  // Nothing to write (every output empty): done, whatever the other sizes (a zero-row problem
  // with d = 2^63 - 1 is valid, and no backend need build its tables).
  if (!writes_anything(*op_declaration(op.kind), args)) return;
  size_t needed = 0;
  backend_call(c, "workspace query", table_of(c).workspace_size(&op, &needed), nullptr);
  if (needed > c.workspace_bytes && !c.allocate)
    fail(EXPANSE_ERROR_WORKSPACE,
         "%s on backend '%s' needs a workspace of %zu bytes, the context has %zu: query expanse_workspace_size and "
         "pass it with expanse_context_set_workspace", expanse_op_name(op.kind), c.backend->name.c_str(), needed,
         c.workspace_bytes);
  expanse_exec exec{c.device, c.stream, c.workspace, c.workspace_bytes};
  if (needed > c.workspace_bytes) {  // the context's allocator, as checked above
    exec.workspace = c.allocate(c.allocate_user, needed);
    exec.workspace_bytes = needed;
    if (!exec.workspace)
      fail(EXPANSE_ERROR_OUT_OF_MEMORY, "%s on backend '%s': the context's allocator returned no workspace of %zu bytes",
           expanse_op_name(op.kind), c.backend->name.c_str(), needed);
  }
  char err[512] = {0};
  const expanse_status st = launch(op, exec, err, sizeof(err));
  err[sizeof(err) - 1] = '\0';
  backend_call(c, expanse_op_name(op.kind), st, err);
}

// An exchanging call's arguments: the callback, the tensors it always needs and, normalized, the
// normalizer's.
void require_exchanged(const char* fn, expanse_exchange_fn exchange, int32_t normalize,
                       std::initializer_list<std::pair<const expanse_tensor*, const char*>> always,
                       std::initializer_list<std::pair<const expanse_tensor*, const char*>> normalized) {
  if (!exchange) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'exchange' is NULL", fn);
  for (const auto& [t, name] : always)
    if (!t) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument '%s' is required", fn, name);
  for (const auto& [t, name] : normalized)
    if (!t && normalize == 1) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument '%s' is required when normalize=1", fn, name);
}

// The backend's one-pass form of an exchanging call (its extra `proc`), when it has one and the
// implementation that takes the problem has such a form: true when it ran. checked_args: the
// arguments without what the callback writes (the finite check reads them).
bool run_exchanging(expanse_context& c, expanse_op_kind kind, const void* args, const void* checked_args,
                    const char* proc, expanse_exchange_fn exchange, void* user) {
  auto* one_pass = reinterpret_cast<expanse_run_exchanging_fn>(
      table_of(c).get_proc_address ? table_of(c).get_proc_address(proc) : nullptr);
  if (!one_pass) return false;
  bool ran = false;
  run_op(c, kind, args, checked_args, [&](const expanse_op& op, const expanse_exec& exec, char* err, size_t n) {
    const expanse_status st = one_pass(&op, &exec, exchange, user, err, n);
    ran = st != EXPANSE_ERROR_UNSUPPORTED;  // declined before any work: the caller composes other calls
    return ran ? st : EXPANSE_OK;
  });
  return ran;
}

}  // namespace

namespace expanse::detail {

int64_t own_state_chunk(expanse_context* ctx, const expanse_power_attention_args& a) {
  int64_t c = 0;
  call(expanse_resolved_chunk_size(ctx, &a, &c));
  c = c > 0 ? c : 128;
  for (const int64_t t = a.k->shape[1]; (t + c - 1) / c > 256;) c *= 2;
  return c;
}

}  // namespace expanse::detail

extern "C" {

EXPANSE_API expanse_status expanse_context_create(const char* backend, int32_t device, expanse_context** ctx) {
  return guarded([&] {
    if (!ctx) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_context_create: argument 'ctx' is NULL");
    *ctx = nullptr;
    const std::string name = backend && *backend ? backend : expanse_default_backend();
    const backend_entry* b = find_backend(name);
    if (!b)
      fail(EXPANSE_ERROR_BACKEND, "no backend named '%s'; known backends: %s. Plugins are searched beside "
           "libexpanse.so and in $EXPANSE_BACKEND_PATH (see `expanse info`)", name.c_str(), known_backends().c_str());
    if (!b->available())
      fail(EXPANSE_ERROR_BACKEND, "backend '%s' is unavailable: %s", name.c_str(), b->reason.c_str());
    if (device < 0 || device >= b->device_count)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "argument 'device': backend '%s' has %d device(s), got device %d",
           name.c_str(), b->device_count, device);
    auto* c = new expanse_context();
    c->backend = b;
    c->device = device;
    void* choose = b->table->get_proc_address ? b->table->get_proc_address(EXPANSE_CHOOSE_CHUNK_SIZE_PROC) : nullptr;
    c->choose_chunk_size = choose ? reinterpret_cast<expanse_choose_chunk_size_fn>(choose) : default_chunk_size;
    *ctx = c;
  });
}

EXPANSE_API void expanse_context_destroy(expanse_context* ctx) { delete ctx; }

EXPANSE_API const char* expanse_context_backend(const expanse_context* ctx) {
  return ctx ? ctx->backend->name.c_str() : "";
}

EXPANSE_API int32_t expanse_context_device_type(const expanse_context* ctx) {
  return ctx ? ctx->backend->table->device_type : 0;
}

EXPANSE_API expanse_status expanse_context_set_stream(expanse_context* ctx, void* stream) {
  return guarded([&] { checked(ctx).stream = stream; });
}

EXPANSE_API expanse_status expanse_context_set_workspace(expanse_context* ctx, void* workspace, size_t bytes) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    if (!workspace && bytes)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_context_set_workspace: 'workspace' is NULL but bytes=%zu", bytes);
    c.workspace = workspace;
    c.workspace_bytes = bytes;
  });
}

EXPANSE_API expanse_status expanse_context_set_allocator(expanse_context* ctx, expanse_allocate_fn allocate, void* user) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    c.allocate = allocate;
    c.allocate_user = user;
  });
}

EXPANSE_API expanse_status expanse_context_set_check_finite(expanse_context* ctx, int32_t enabled) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    if (enabled != 0 && enabled != 1)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_context_set_check_finite: argument 'enabled' must be 0 or 1, got %d",
           enabled);
    c.check_finite = enabled == 1;
  });
}

EXPANSE_API expanse_status expanse_resolved_chunk_size(expanse_context* ctx, const expanse_power_attention_args* a,
                                                       int64_t* chunk_size) {
  return guarded([&] {
    if (!chunk_size) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_resolved_chunk_size: argument 'chunk_size' is NULL");
    expanse_context& c = checked(ctx);
    validated_op v;
    validate_op(expanse::op_kind_of<expanse_power_attention_args>::value, a, requirement_of(c), v);
    *chunk_size = v.chunk_size;
  });
}

EXPANSE_API expanse_status expanse_supports(expanse_context* ctx, expanse_op_kind kind, const void* args, char* reason,
                                            size_t reason_len) {
  const expanse_status st = guarded([&] {
    validated_op v;
    expanse_op op{};
    prepare(checked(ctx), enum_code(kind), args, v, op);
  });
  if (reason && reason_len) {
    const std::string text = st == EXPANSE_OK ? std::string() : std::string(expanse_last_error());
    const size_t n = std::min(reason_len - 1, text.size());
    text.copy(reason, n);
    reason[n] = '\0';
  }
  return st;
}

EXPANSE_API expanse_status expanse_workspace_size(expanse_context* ctx, expanse_op_kind kind, const void* args,
                                                  size_t* bytes) {
  return guarded([&] {
    if (!bytes) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_workspace_size: argument 'bytes' is NULL");
    expanse_context& c = checked(ctx);
    validated_op v;
    expanse_op op{};
    prepare(c, enum_code(kind), args, v, op);
    *bytes = 0;
    backend_call(c, "workspace query", table_of(c).workspace_size(&op, bytes), nullptr);
  });
}

EXPANSE_API expanse_status expanse_run(expanse_context* ctx, expanse_op_kind kind, const void* args) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    run_op(c, enum_code(kind), args, args, [&](const expanse_op& op, const expanse_exec& exec, char* err, size_t n) {
      return table_of(c).run(&op, &exec, err, n);
    });
  });
}

EXPANSE_API expanse_status expanse_power_attention_exchange(expanse_context* ctx, const expanse_power_attention_args* a,
                                                            expanse_exchange_fn exchange, void* user) {
  return guarded([&] {
    const char* fn = "power_attention_exchange";
    expanse_context& c = checked(ctx);
    if (!a) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'a' is NULL", fn);
    require_exchanged(fn, exchange, a->normalize, {{a->initial_S, "initial_S"}, {a->final_S, "final_S"}},
                      {{a->initial_z, "initial_z"}, {a->final_z, "final_z"}});
    // The arguments whose values exist before the callback: no initial state yet.
    expanse_power_attention_args without = *a;
    without.initial_S = without.initial_z = nullptr;
    if (run_exchanging(c, EXPANSE_OP_POWER_ATTENTION, a, &without, EXPANSE_FORWARD_EXCHANGE_PROC, exchange, user))
      return;
    // Two calls: the piece's final state from zero (sequence_state), the exchange, then the piece
    // from the initial state.
    expanse_sequence_state_args own;
    expanse_sequence_state_args_init(&own);
    own.k = a->k, own.v = a->v, own.log_g = a->log_g, own.S = a->final_S, own.z = a->final_z;
    own.p = a->p, own.chunk_size = own_state_chunk(ctx, *a), own.layout = a->layout;
    call(expanse_sequence_state(ctx, &own));
    if (exchange(c.stream, user) != 0) fail(EXPANSE_ERROR_INTERNAL, "%s: the exchange callback failed", fn);
    expanse_power_attention_args piece = *a;
    piece.final_S = piece.final_z = nullptr;
    call(expanse_power_attention(ctx, &piece));
  });
}

EXPANSE_API expanse_status expanse_power_attention_backward_exchange(expanse_context* ctx,
                                                                     const expanse_power_attention_backward_args* a,
                                                                     expanse_exchange_fn exchange, void* user) {
  return guarded([&] {
    const char* fn = "power_attention_backward_exchange";
    expanse_context& c = checked(ctx);
    if (!a) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'a' is NULL", fn);
    require_exchanged(fn, exchange, a->normalize,
                      {{a->initial_S, "initial_S"}, {a->dinitial_S, "dinitial_S"}, {a->dfinal_S, "dfinal_S"}},
                      {{a->initial_z, "initial_z"}, {a->dinitial_z, "dinitial_z"}, {a->dfinal_z, "dfinal_z"}});
    // The first pass's arguments: no final-state cotangent (the finite check reads these, as dfinal
    // holds nothing yet).
    expanse_power_attention_backward_args without = *a;
    without.dfinal_S = without.dfinal_z = nullptr;
    if (run_exchanging(c, EXPANSE_OP_POWER_ATTENTION_BACKWARD, a, &without, EXPANSE_BACKWARD_EXCHANGE_PROC, exchange,
                       user))
      return;
    call(expanse_power_attention_backward(ctx, &without));  // dinitial without dfinal
    if (exchange(c.stream, user) != 0) fail(EXPANSE_ERROR_INTERNAL, "%s: the exchange callback failed", fn);
    call(expanse_power_attention_backward(ctx, a));
  });
}

// expanse_<name>(ctx, args) for every operation.
#define EXPANSE_TYPED_OP(name, NAME)                                                              \
  EXPANSE_API expanse_status expanse_##name(expanse_context* ctx, const expanse_##name##_args* a) { \
    return expanse_run(ctx, EXPANSE_OP_##NAME, a);                                                \
  }
EXPANSE_OPERATIONS(EXPANSE_TYPED_OP)
#undef EXPANSE_TYPED_OP

EXPANSE_API expanse_status expanse_malloc(expanse_context* ctx, size_t bytes, void** ptr) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    if (!ptr) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_malloc: argument 'ptr' is NULL");
    *ptr = nullptr;
    char err[512] = {0};
    const expanse_status st = table_of(c).memory_alloc(c.device, bytes, ptr, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    if (st != EXPANSE_OK)
      fail(EXPANSE_ERROR_OUT_OF_MEMORY, "allocating %zu bytes on backend '%s' failed: %s", bytes,
           c.backend->name.c_str(), err);
  });
}

EXPANSE_API expanse_status expanse_free(expanse_context* ctx, void* ptr) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    if (ptr) backend_call(c, "free", table_of(c).memory_free(c.device, ptr), nullptr);
  });
}

EXPANSE_API expanse_status expanse_memcpy(expanse_context* ctx, void* dst, const void* src, size_t bytes,
                                          expanse_copy_kind kind) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    if (bytes == 0) return;
    if (!dst || !src) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_memcpy: 'dst' and 'src' must not be NULL");
    const int32_t code = enum_code(kind);
    if (code < EXPANSE_COPY_HOST_TO_DEVICE || code > EXPANSE_COPY_DEVICE_TO_DEVICE)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_memcpy: argument 'kind': unknown copy kind %d", code);
    char err[512] = {0};
    const expanse_status st = table_of(c).memory_copy(c.device, dst, src, bytes, kind, c.stream, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    backend_call(c, "copy", st, err);
  });
}

EXPANSE_API expanse_status expanse_synchronize(expanse_context* ctx) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    char err[512] = {0};
    const expanse_status st = table_of(c).synchronize(c.device, c.stream, err, sizeof(err));
    err[sizeof(err) - 1] = '\0';
    backend_call(c, "synchronize", st, err);
  });
}

EXPANSE_API expanse_status expanse_backend_proc(const expanse_context* ctx, const char* name, void** proc) {
  return guarded([&] {
    if (!ctx) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_backend_proc: argument 'ctx' is NULL");
    if (!name) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_backend_proc: argument 'name' is NULL");
    if (!proc) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_backend_proc: argument 'proc' is NULL");
    const expanse_backend& table = *ctx->backend->table;
    *proc = table.get_proc_address ? table.get_proc_address(name) : nullptr;
    if (!*proc) fail(EXPANSE_ERROR_UNSUPPORTED, "backend '%s' has no extra named '%s'", ctx->backend->name.c_str(), name);
  });
}

EXPANSE_API expanse_status expanse_time_runs(expanse_context* ctx, void (*body)(void* user), void* user,
                                             int32_t reps, float* ms) {
  return guarded([&] {
    expanse_context& c = checked(ctx);
    if (!body || !ms || reps < 1) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_time_runs: needs body, ms and reps >= 1");
    using timer_fn = int (*)(void*, void (*)(void*), void*, int, float*);
    void* proc = table_of(c).get_proc_address ? table_of(c).get_proc_address("expanse_timed_runs") : nullptr;
    if (!proc) fail(EXPANSE_ERROR_UNSUPPORTED, "backend '%s' has no device timer", c.backend->name.c_str());
    if (reinterpret_cast<timer_fn>(proc)(c.stream, body, user, reps, ms) != 0)
      fail(EXPANSE_ERROR_INTERNAL, "expanse_time_runs: the device timer of backend '%s' failed", c.backend->name.c_str());
  });
}

}  // extern "C"
