#include "registry.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "errors.hpp"
#include "plugin_loader.hpp"
#include "reference/reference_backend.hpp"

namespace expanse::detail {
namespace {

backend_entry reference_entry() {
  backend_entry ref;
  ref.table = expanse_reference_backend();
  ref.name = ref.table->name;
  ref.abi_version = ref.table->abi_version;
  ref.status = backend_entry::state::loaded;
  char err[256] = {0};
  if (ref.table->init(err, sizeof(err)) != EXPANSE_OK) ref.reason = err;
  ref.device_count = ref.table->device_count();
  return ref;
}

// The entries are found once (no module is opened for that) and never added or removed afterwards,
// so a context may keep a pointer to its entry; a pending entry is loaded in place under `loading`.
struct registry {
  std::vector<backend_entry> entries;
  std::mutex loading;  // serializes dlopen and plugin init, and guards each entry's `status`

  registry() {
    entries.push_back(reference_entry());
    for (backend_entry& e : find_plugins({entries.front().name})) entries.push_back(std::move(e));
  }

  // Loads e's module if it is pending; afterwards e never changes again. Needs `loading` held.
  static void ensure_loaded(backend_entry& e) {
    if (e.status == backend_entry::state::pending) load_plugin(e);
  }
};

registry& the_registry() {
  static registry r;  // thread-safe initialization
  return r;
}

}  // namespace

const std::vector<backend_entry>& backends() {
  registry& r = the_registry();
  std::lock_guard<std::mutex> lock(r.loading);
  for (backend_entry& e : r.entries) registry::ensure_loaded(e);
  return r.entries;
}

const backend_entry* find_backend(const std::string& name) {
  registry& r = the_registry();
  std::lock_guard<std::mutex> lock(r.loading);
  // The module that owns the name (found first and loadable); else a skipped entry of that name,
  // whose reason then explains why it cannot be used.
  backend_entry* match = nullptr;
  for (backend_entry& e : r.entries) {
    if (e.name != name) continue;
    if (e.status != backend_entry::state::skipped) {
      match = &e;
      break;
    }
    if (!match) match = &e;
  }
  if (match) registry::ensure_loaded(*match);
  return match;
}

}  // namespace expanse::detail

using namespace expanse::detail;

namespace {
void copy_text(char* dst, size_t cap, const std::string& src) {
  const size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}
}  // namespace

extern "C" {

EXPANSE_API int32_t expanse_backend_count(void) {
  try {
    return static_cast<int32_t>(backends().size());
  } catch (...) {
    return 0;
  }
}

EXPANSE_API expanse_status expanse_backend_get_info(int32_t index, expanse_backend_info* info) {
  return guarded([&] {
    if (!info) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_backend_get_info: argument 'info' is NULL");
    const auto& list = backends();
    if (index < 0 || index >= static_cast<int32_t>(list.size()))
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_backend_get_info: index %d out of range 0..%zu", index,
           list.size());
    const backend_entry& b = list[static_cast<size_t>(index)];
    std::memset(info, 0, sizeof(*info));
    copy_text(info->name, sizeof(info->name), b.name);
    copy_text(info->path, sizeof(info->path), b.path);
    copy_text(info->reason, sizeof(info->reason), b.reason);
    info->available = b.available() ? 1 : 0;
    info->device_count = b.available() ? b.device_count : 0;
    info->abi_version = b.abi_version;
  });
}

EXPANSE_API expanse_status expanse_backend_device_info(const char* backend, int32_t device,
                                                       expanse_device_info* info) {
  return guarded([&] {
    if (!info) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_backend_device_info: argument 'info' is NULL");
    const std::string name = backend && *backend ? backend : expanse_default_backend();
    const backend_entry* b = find_backend(name);
    if (!b) fail(EXPANSE_ERROR_BACKEND, "no backend named '%s' (see `expanse info`)", name.c_str());
    if (!b->available()) fail(EXPANSE_ERROR_BACKEND, "backend '%s' is unavailable: %s", name.c_str(), b->reason.c_str());
    if (device < 0 || device >= b->device_count)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "argument 'device': backend '%s' has %d device(s), got device %d",
           name.c_str(), b->device_count, device);
    std::memset(info, 0, sizeof(*info));
    if (b->table->device_info(device, info) != EXPANSE_OK)
      fail(EXPANSE_ERROR_BACKEND, "backend '%s' could not describe device %d", name.c_str(), device);
    info->name[sizeof(info->name) - 1] = '\0';
  });
}

EXPANSE_API const char* expanse_default_backend(void) {
  const char* env = std::getenv("EXPANSE_BACKEND");
  return env && *env ? env : "reference";
}

}  // extern "C"
