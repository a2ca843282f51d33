// The reference backend's table: host memory, oneTBB threads, every op computed in f64 by the
// functions of ops.hpp. It supports every problem the core validates.
#include "reference/reference_backend.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include <tbb/info.h>

#include "reference/ops.hpp"

namespace {

// Writes the message into the caller's buffer, truncated and always NUL-terminated.
void set_error(char* err, size_t err_len, const char* message) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", message);
}

expanse_status ref_init(char* err, size_t err_len) {
  set_error(err, err_len, "");
  return EXPANSE_OK;
}

int32_t ref_device_count() { return 1; }

expanse_status ref_device_info(int32_t device, expanse_device_info* info) {
  if (device != 0 || info == nullptr) return EXPANSE_ERROR_INVALID_ARGUMENT;
  std::memset(info, 0, sizeof(*info));
  const int threads = tbb::info::default_concurrency();
  std::snprintf(info->name, sizeof(info->name), "CPU (oneTBB, %d threads)", threads);
  info->device_type = EXPANSE_DEVICE_CPU;
  info->device_id = 0;
  info->multiprocessors = threads;
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  info->memory_bytes = pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
  return EXPANSE_OK;
}

expanse_status ref_supports(const expanse_op*, char* reason, size_t reason_len) {
  set_error(reason, reason_len, "");
  return EXPANSE_OK;  // the core has validated the problem; the reference implements all of it
}

expanse_status ref_workspace_size(const expanse_op*, size_t* bytes) {
  if (bytes != nullptr) *bytes = 0;
  return EXPANSE_OK;
}

// Runs one op synchronously. No exception leaves: bad_alloc becomes OUT_OF_MEMORY, anything else
// INTERNAL, with the text in err.
expanse_status ref_run(const expanse_op* op, const expanse_exec*, char* err, size_t err_len) {
  if (op == nullptr || op->args == nullptr || op->problem == nullptr) {
    set_error(err, err_len, "reference: run called without op, args or problem");
    return EXPANSE_ERROR_INTERNAL;
  }
  const expanse_problem& pb = *op->problem;
  try {
    // expanse_ref::<name>(problem, args) by the op's kind: one entry per operation (reference/ops.hpp).
    using runner = void (*)(const expanse_problem&, const void*);
#define EXPANSE_REF_ENTRY(name, NAME) \
  [](const expanse_problem& p, const void* a) { expanse_ref::name(p, *static_cast<const expanse_##name##_args*>(a)); },
    static const runner runners[EXPANSE_OP_COUNT] = {EXPANSE_OPERATIONS(EXPANSE_REF_ENTRY)};
#undef EXPANSE_REF_ENTRY
    if (op->kind < 0 || op->kind >= EXPANSE_OP_COUNT) {
      char message[64];
      std::snprintf(message, sizeof(message), "reference: unknown op kind %d", static_cast<int>(op->kind));
      set_error(err, err_len, message);
      return EXPANSE_ERROR_INTERNAL;
    }
    runners[op->kind](pb, op->args);
  } catch (const std::bad_alloc&) {
    set_error(err, err_len, "reference: out of host memory");
    return EXPANSE_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_error(err, err_len, e.what());
    return EXPANSE_ERROR_INTERNAL;
  } catch (...) {
    set_error(err, err_len, "reference: unknown exception");
    return EXPANSE_ERROR_INTERNAL;
  }
  return EXPANSE_OK;
}

// Host memory, 64-byte aligned. bytes == 0 still returns a valid (freeable) allocation.
constexpr size_t kAlignment = 64;

expanse_status ref_memory_alloc(int32_t, size_t bytes, void** ptr, char* err, size_t err_len) {
  if (ptr == nullptr) {
    set_error(err, err_len, "reference: memory_alloc needs ptr");
    return EXPANSE_ERROR_INVALID_ARGUMENT;
  }
  *ptr = nullptr;
  if (bytes > SIZE_MAX - kAlignment) {
    set_error(err, err_len, "reference: allocation size overflows");
    return EXPANSE_ERROR_OUT_OF_MEMORY;
  }
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t rounded = bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    char message[128];
    std::snprintf(message, sizeof(message), "reference: cannot allocate %zu bytes of host memory", bytes);
    set_error(err, err_len, message);
    return EXPANSE_ERROR_OUT_OF_MEMORY;
  }
  *ptr = p;
  return EXPANSE_OK;
}

expanse_status ref_memory_free(int32_t, void* ptr) {
  std::free(ptr);  // free(NULL) is a no-op
  return EXPANSE_OK;
}

expanse_status ref_memory_copy(int32_t, void* dst, const void* src, size_t bytes, expanse_copy_kind,
                               void*, char*, size_t) {
  if (bytes > 0) std::memcpy(dst, src, bytes);  // every kind is host to host here
  return EXPANSE_OK;
}

expanse_status ref_synchronize(int32_t, void*, char*, size_t) { return EXPANSE_OK; }  // runs are synchronous

// power_attention's form and chunk size for EXPANSE_CHUNK_AUTO here. Per query head and token, the
// quadratic form visits t / 2 keys at about d + e + 40 multiply-add equivalents each (the exp and
// the power cost the 40), and the chunked form c / 2 keys plus the state products D e (1 + 1/r)
// through Eigen. Measured on 2 cores at P1 (f32 inputs): quadratic 0.53 s and chunked (c = 128)
// 0.82 s at t = 2048, 2.50 s and 1.80 s at t = 4096; the model puts the crossover at t = 3300.
int64_t ref_choose_chunk_size(const expanse_problem* pb) {
  constexpr int64_t kChunk = 128;
  const double r = pb->h > 0 ? double(pb->hq) / double(pb->h) : 1.0;
  const double state = double(pb->D) * double(pb->e) * (1.0 + 1.0 / r);
  const double crossover = double(kChunk) + 2.0 * state / double(pb->d + pb->e + 40);
  return double(pb->t) < crossover ? 0 : kChunk;
}

void* ref_get_proc_address(const char* name) {
  if (std::strcmp(name, EXPANSE_CHOOSE_CHUNK_SIZE_PROC) == 0) return reinterpret_cast<void*>(&ref_choose_chunk_size);
  return nullptr;
}

const expanse_backend kReferenceBackend = {
    EXPANSE_BACKEND_ABI_VERSION,
    static_cast<uint32_t>(sizeof(expanse_backend)),
    "reference",
    EXPANSE_DEVICE_CPU,
    ref_init,
    ref_device_count,
    ref_device_info,
    ref_supports,
    ref_workspace_size,
    ref_run,
    ref_memory_alloc,
    ref_memory_free,
    ref_memory_copy,
    ref_synchronize,
    ref_get_proc_address,
};

}  // namespace

const expanse_backend* expanse_reference_backend() { return &kReferenceBackend; }
