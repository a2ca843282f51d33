#include "plugin_loader.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "errors.hpp"

namespace expanse::detail {
namespace {

const char kPrefix[] = "libexpanse-";
const char kSuffix[] = ".so";

bool is_plugin_name(const std::string& file) {
  const size_t np = sizeof(kPrefix) - 1, ns = sizeof(kSuffix) - 1;
  return file.size() > np + ns && file.compare(0, np, kPrefix) == 0 &&
         file.compare(file.size() - ns, ns, kSuffix) == 0;
}

std::string name_from_path(const std::string& path) {
  std::string file = path.substr(path.find_last_of('/') + 1);
  if (!is_plugin_name(file)) return file;
  return file.substr(sizeof(kPrefix) - 1, file.size() - (sizeof(kPrefix) - 1) - (sizeof(kSuffix) - 1));
}

std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_search_dirs), &info) == 0 || !info.dli_fname) return {};
  std::string path = info.dli_fname;
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

}  // namespace

std::vector<std::string> plugin_search_dirs() {
  std::vector<std::string> dirs;
  if (std::string own = own_directory(); !own.empty()) dirs.push_back(own);
  if (const char* env = std::getenv("EXPANSE_BACKEND_PATH")) {
    std::string list = env;
    size_t start = 0;
    while (start <= list.size()) {
      size_t colon = list.find(':', start);
      if (colon == std::string::npos) colon = list.size();
      if (colon > start) dirs.push_back(list.substr(start, colon - start));
      start = colon + 1;
    }
  }
  return dirs;
}

std::vector<std::string> plugin_files_in(const std::string& dir) {
  std::vector<std::string> files;
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0) return files;
  if (S_ISREG(st.st_mode)) {  // an entry of EXPANSE_BACKEND_PATH may name a module file itself
    files.push_back(dir);
    return files;
  }
  DIR* d = opendir(dir.c_str());
  if (!d) return files;
  while (dirent* ent = readdir(d)) {
    std::string file = ent->d_name;
    if (is_plugin_name(file)) files.push_back(dir + "/" + file);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

backend_entry load_plugin(const std::string& path) {
  backend_entry entry;
  entry.path = path;
  entry.name = name_from_path(path);
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    entry.reason = std::string("cannot load module: ") + (why ? why : "unknown dlopen error");
    return entry;
  }
  auto entry_fn = reinterpret_cast<expanse_backend_entry_fn>(dlsym(handle, EXPANSE_BACKEND_ENTRY_SYMBOL));
  if (!entry_fn) {
    entry.reason = std::string("not an expanse backend: the module exports no '") + EXPANSE_BACKEND_ENTRY_SYMBOL + "'";
    dlclose(handle);
    return entry;
  }
  const expanse_backend* table = entry_fn();
  if (!table) {
    entry.reason = "the module's entry point returned no backend table";
    dlclose(handle);
    return entry;
  }
  entry.abi_version = table->abi_version;
  if (table->abi_version != EXPANSE_BACKEND_ABI_VERSION || table->struct_size < sizeof(expanse_backend)) {
    entry.reason = format("built for plugin ABI version %u (table of %u bytes), but this libexpanse %s expects "
                          "version %u (%zu bytes): rebuild the plugin against this version",
                          table->abi_version, table->struct_size, expanse_version(), EXPANSE_BACKEND_ABI_VERSION,
                          sizeof(expanse_backend));
    dlclose(handle);
    return entry;
  }
  if (table->name && *table->name) entry.name = table->name;
  const bool complete = table->init && table->device_count && table->device_info && table->supports &&
                        table->workspace_size && table->run && table->memory_alloc && table->memory_free &&
                        table->memory_copy && table->synchronize;
  if (!complete) {
    entry.reason = "the module's backend table has missing functions";
    dlclose(handle);
    return entry;
  }
  // From here the module stays loaded for the life of the process (it may own driver state).
  entry.table = table;
  char err[512] = {0};
  const expanse_status st = table->init(err, sizeof(err));
  err[sizeof(err) - 1] = '\0';
  if (st != EXPANSE_OK) {
    entry.reason = err[0] ? err : "the backend's initialization failed";
    return entry;
  }
  entry.device_count = table->device_count();
  if (entry.device_count <= 0) entry.reason = "no device found";
  return entry;
}

}  // namespace expanse::detail
