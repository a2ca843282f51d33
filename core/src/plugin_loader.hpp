// Finding and loading backend plugin modules (libexpanse-<name>.so) with dlopen.
#pragma once

#include <string>
#include <vector>

#include "registry.hpp"

namespace expanse::detail {

// Directories searched, in order: the folder holding libexpanse.so, then $EXPANSE_BACKEND_PATH.
std::vector<std::string> plugin_search_dirs();
// Plugin files in `dir` (names libexpanse-<name>.so), sorted.
std::vector<std::string> plugin_files_in(const std::string& dir);
// Loads one module; never throws or crashes on a bad module: failures are recorded in `reason`.
backend_entry load_plugin(const std::string& path);

}  // namespace expanse::detail
