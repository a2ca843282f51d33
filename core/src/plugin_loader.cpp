#include "plugin_loader.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>

#include "errors.hpp"

namespace expanse::detail {
namespace {

const char kPrefix[] = "libexpanse-";
const char kSuffix[] = ".so";

std::string base_name(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

bool is_plugin_name(const std::string& file) {
  const size_t np = sizeof(kPrefix) - 1, ns = sizeof(kSuffix) - 1;
  return file.size() > np + ns && file.compare(0, np, kPrefix) == 0 &&
         file.compare(file.size() - ns, ns, kSuffix) == 0;
}

std::string name_from_path(const std::string& path) {
  std::string file = base_name(path);
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

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

// Paths to consider under one search entry: the plugin-named files of a directory (sorted), or the
// entry itself when it names something else (EXPANSE_BACKEND_PATH may name a module file).
std::vector<std::string> paths_under(const std::string& dir) {
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0) return {};  // a missing search folder is not an error
  if (!S_ISDIR(st.st_mode)) return {dir};
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (!d) return files;
  while (dirent* ent = readdir(d)) {
    const std::string file = ent->d_name;
    if (is_plugin_name(file)) files.push_back(dir + "/" + file);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

// The file `path` resolves to, so that one module reached through two paths is listed once.
std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// Why `path` can never be loaded; empty when it is a regular file named like a plugin. Nothing is
// opened: stat reads only the directory entry (open() on a FIFO would block).
std::string not_loadable_reason(const std::string& path) {
  if (!is_plugin_name(base_name(path)))
    return "named on EXPANSE_BACKEND_PATH but not named libexpanse-<name>.so: not loaded";
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) return std::string("cannot read the file: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode))
    return std::string("not a regular file (") + file_kind(st.st_mode) + "): only regular files are loaded";
  return {};
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

std::vector<backend_entry> find_plugins(const std::vector<std::string>& taken) {
  std::vector<backend_entry> found;
  std::set<std::string> seen;  // real paths
  for (const std::string& dir : plugin_search_dirs()) {
    for (const std::string& path : paths_under(dir)) {
      if (!seen.insert(real_path(path)).second) continue;  // the same file again: list it once
      backend_entry entry;
      entry.path = path;
      entry.name = name_from_path(path);
      entry.reason = not_loadable_reason(path);
      if (entry.reason.empty()) {
        // The first loadable module of a name owns it; a later one is listed and never loaded.
        if (std::find(taken.begin(), taken.end(), entry.name) != taken.end()) {
          entry.reason = "the built-in backend '" + entry.name + "' has this name; this module is ignored";
        } else {
          for (const backend_entry& other : found)
            if (other.name == entry.name && other.status == backend_entry::state::pending)
              entry.reason = "a module of backend '" + entry.name + "' was found first at " + other.path +
                             "; this one is ignored";
        }
      }
      entry.status = entry.reason.empty() ? backend_entry::state::pending : backend_entry::state::skipped;
      found.push_back(std::move(entry));
    }
  }
  return found;
}

void load_plugin(backend_entry& entry) {
  const std::string& path = entry.path;
  entry.status = backend_entry::state::loaded;
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    entry.reason = std::string("cannot load module: ") + (why ? why : "unknown dlopen error");
    return;
  }
  auto entry_fn = reinterpret_cast<expanse_backend_entry_fn>(dlsym(handle, EXPANSE_BACKEND_ENTRY_SYMBOL));
  if (!entry_fn) {
    entry.reason = std::string("not an expanse backend: the module exports no '") + EXPANSE_BACKEND_ENTRY_SYMBOL + "'";
    dlclose(handle);
    return;
  }
  const expanse_backend* table = entry_fn();
  if (!table) {
    entry.reason = "the module's entry point returned no backend table";
    dlclose(handle);
    return;
  }
  entry.abi_version = table->abi_version;
  if (table->abi_version != EXPANSE_BACKEND_ABI_VERSION || table->struct_size < sizeof(expanse_backend)) {
    entry.reason = format("built for plugin ABI version %u (table of %u bytes), but this libexpanse %s expects "
                          "version %u (%zu bytes): rebuild the plugin against this version",
                          table->abi_version, table->struct_size, expanse_version(), EXPANSE_BACKEND_ABI_VERSION,
                          sizeof(expanse_backend));
    dlclose(handle);
    return;
  }
  // A backend is looked up by its file name without loading the others, so the two must agree.
  if (table->name && *table->name && entry.name != table->name) {
    entry.reason = "the module's backend is named '" + std::string(table->name) + "', but its file is " +
                   base_name(path) + ": name the file libexpanse-" + table->name + ".so";
    dlclose(handle);
    return;
  }
  const bool complete = table->init && table->device_count && table->device_info && table->supports &&
                        table->workspace_size && table->run && table->memory_alloc && table->memory_free &&
                        table->memory_copy && table->synchronize;
  if (!complete) {
    entry.reason = "the module's backend table has missing functions";
    dlclose(handle);
    return;
  }
  // From here the module stays loaded for the life of the process (it may own driver state).
  entry.table = table;
  char err[512] = {0};
  const expanse_status st = table->init(err, sizeof(err));
  err[sizeof(err) - 1] = '\0';
  if (st != EXPANSE_OK) {
    entry.reason = err[0] ? err : "the backend's initialization failed";
    return;
  }
  entry.device_count = table->device_count();
  if (entry.device_count <= 0) entry.reason = "no device found";
}

}  // namespace expanse::detail
