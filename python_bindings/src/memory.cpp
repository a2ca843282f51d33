// Memory owned by a backend, for callers without a framework on that device: expanse.check() puts
// its random inputs on any backend's device with these, and arrays of producers that expanse cannot
// allocate for (JAX on a GPU, bfloat16 on the CPU without PyTorch) get their outputs here. The
// arrays returned support DLPack (__dlpack__) and, on the CPU, the buffer protocol.
#include <cstring>
#include <string>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "contexts.hpp"
#include "errors.hpp"
#include "tensors.hpp"

namespace expanse_py {
namespace {

// One allocation and the context that frees it. A context of its own (not the thread's cached one):
// the array may be released on another thread, or after that thread has ended.
struct allocation {
  expanse_context* ctx = nullptr;
  void* ptr = nullptr;
  ~allocation() {
    if (ptr) expanse_free(ctx, ptr);
    if (ctx) expanse_context_destroy(ctx);
  }
};

nb::ndarray<nb::array_api> alloc(const std::string& backend, int32_t device, const std::vector<int64_t>& shape,
                    const std::string& dtype) {
  const nb::dlpack::dtype dt = dlpack_dtype(dtype);
  size_t bytes = dt.bits / 8;
  for (int64_t s : shape) {
    if (s < 0) throw nb::value_error("alloc: negative dimension");
    bytes *= static_cast<size_t>(s);
  }
  auto* a = new allocation();
  nb::capsule owner(a, [](void* p) noexcept { delete static_cast<allocation*>(p); });
  check(expanse_context_create(backend.c_str(), device, &a->ctx));
  check(expanse_malloc(a->ctx, bytes, &a->ptr));
  std::vector<size_t> extents(shape.begin(), shape.end());
  return nb::ndarray<nb::array_api>(a->ptr, extents.size(), extents.data(), owner, nullptr, dt,
                       expanse_context_device_type(a->ctx), device);
}

// copy(backend, device, dst, src): the bytes of src into dst (both contiguous, equal byte sizes), on
// whichever side each lives, through the backend; waits for the copy to finish.
void copy(const std::string& backend, int32_t device, nb::handle dst, nb::handle src) {
  array_keeper keep;
  const auto d = keep.bytes_of("dst", dst, /*writable=*/true);
  const auto s = keep.bytes_of("src", src, /*writable=*/false);
  if (!d.contiguous || !s.contiguous) throw nb::value_error("copy: both arrays must be contiguous");
  if (d.bytes != s.bytes)
    throw nb::value_error(("copy: dst has " + std::to_string(d.bytes) + " bytes, src " + std::to_string(s.bytes))
                              .c_str());
  expanse_context* ctx = context_for(backend, device);
  const bool src_host = s.device_type == EXPANSE_DEVICE_CPU, dst_host = d.device_type == EXPANSE_DEVICE_CPU;
  const expanse_copy_kind kind = src_host && !dst_host   ? EXPANSE_COPY_HOST_TO_DEVICE
                                 : !src_host && dst_host ? EXPANSE_COPY_DEVICE_TO_HOST
                                                         : EXPANSE_COPY_DEVICE_TO_DEVICE;
  if (d.bytes == 0) return;
  check(expanse_context_set_stream(ctx, nullptr));
  check(expanse_memcpy(ctx, d.data, s.data, d.bytes, kind));
  check(expanse_synchronize(ctx));
}

}  // namespace

void bind_memory(nb::module_& m) {
  m.def("alloc", &alloc, nb::arg("backend"), nb::arg("device"), nb::arg("shape"), nb::arg("dtype"),
        "A contiguous, uninitialized array of dtype ('f16', 'bf16', 'f32', 'f64' or 'u8') in the memory of "
        "backend's device, freed with the array.");
  m.def("copy", &copy, nb::arg("backend"), nb::arg("device"), nb::arg("dst"), nb::arg("src"),
        "Copies the bytes of src into dst through backend (host or device memory, either side) and waits.");
}

}  // namespace expanse_py
