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

std::vector<backend_entry> discover() {
  std::vector<backend_entry> found;
  backend_entry ref;
  ref.table = expanse_reference_backend();
  ref.name = ref.table->name;
  ref.abi_version = ref.table->abi_version;
  char err[256] = {0};
  if (ref.table->init(err, sizeof(err)) != EXPANSE_OK) ref.reason = err;
  ref.device_count = ref.table->device_count();
  found.push_back(ref);

  for (const std::string& dir : plugin_search_dirs()) {
    for (const std::string& file : plugin_files_in(dir)) {
      backend_entry entry = load_plugin(file);
      bool duplicate = false;
      for (const backend_entry& other : found) {
        if (other.path == entry.path) duplicate = true;  // same file reached twice: skip silently
        else if (other.name == entry.name && entry.table) {
          entry.reason = "a backend named '" + entry.name + "' was already loaded from " +
                         (other.path.empty() ? std::string("the core") : other.path) + "; this one is ignored";
          entry.table = nullptr;
        }
      }
      if (!duplicate) found.push_back(std::move(entry));
    }
  }
  return found;
}

}  // namespace

const std::vector<backend_entry>& backends() {
  static std::once_flag once;
  static std::vector<backend_entry> list;
  std::call_once(once, [] { list = discover(); });
  return list;
}

const backend_entry* find_backend(const std::string& name) {
  for (const backend_entry& b : backends())
    if (b.name == name) return &b;
  return nullptr;
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
