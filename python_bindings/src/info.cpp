// Version, backends, devices, the default backend and the expanded dimension D.
#include <string>

#include <nanobind/stl/string.h>

#include "errors.hpp"

namespace expanse_py {
namespace {

nb::list backends() {
  nb::list list;
  const int32_t count = expanse_backend_count();
  for (int32_t i = 0; i < count; ++i) {
    expanse_backend_info info{};
    check(expanse_backend_get_info(i, &info));
    nb::dict d;
    d["name"] = std::string(info.name);
    d["path"] = std::string(info.path);
    d["available"] = info.available != 0;
    d["reason"] = std::string(info.reason);
    d["device_count"] = info.device_count;
    d["abi_version"] = info.abi_version;
    list.append(d);
  }
  return list;
}

nb::dict device_info(const std::string& backend, int32_t device) {
  expanse_device_info info{};
  check(expanse_backend_device_info(backend.c_str(), device, &info));
  nb::dict d;
  d["name"] = std::string(info.name);
  d["device_type"] = info.device_type;
  d["device_id"] = info.device_id;
  d["compute_major"] = info.compute_major;
  d["compute_minor"] = info.compute_minor;
  d["multiprocessors"] = info.multiprocessors;
  d["memory_bytes"] = info.memory_bytes;
  return d;
}

int64_t expanded_dim(int32_t p, int64_t d, int32_t kind, int32_t d_tile) {
  int64_t D = 0;
  check(expanse_expanded_dim(p, d, expanse_layout{kind, d_tile}, &D));
  return D;
}

}  // namespace

void bind_info(nb::module_& m) {
  m.def("version", [] { return std::string(expanse_version()); }, "The version of libexpanse.");
  m.def("backends", &backends,
        "Backends known to the registry, reference first: dicts with name, path, available, reason, "
        "device_count and abi_version.");
  m.def("device_info", &device_info, nb::arg("backend"), nb::arg("device"),
        "Describes a device of an available backend: name, device_type (DLPack code), device_id, "
        "compute_major/minor, multiprocessors and memory_bytes.");
  m.def("default_backend", [] { return std::string(expanse_default_backend()); },
        "$EXPANSE_BACKEND if set, else 'reference'.");
  m.def("expanded_dim", &expanded_dim, nb::arg("p"), nb::arg("d"), nb::arg("kind") = 0, nb::arg("d_tile") = 0,
        "The expanded dimension D of phi for degree p, head dim d and a layout (kind 0 sympow, 1 tiled, 2 tensor).");
}

}  // namespace expanse_py
