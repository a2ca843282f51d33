// Finding backend plugin modules (libexpanse-<name>.so) and loading them with dlopen.
//
// Finding only reads directories and stats files; nothing is opened. Loading is a separate step
// that the registry takes when a backend is actually needed, because dlopen runs the module's
// constructors in this process and open() on something that is not a regular file (a FIFO) blocks.
#pragma once

#include <string>
#include <vector>

#include "registry.hpp"

namespace expanse::detail {

// Directories searched, in order: the folder holding libexpanse.so, then $EXPANSE_BACKEND_PATH.
std::vector<std::string> plugin_search_dirs();
// Every file named like a plugin in the search directories, in search order (sorted within a
// directory), each real file once however many paths reach it. Entries are named from the file
// name and marked `pending` when they are to be loaded; the others carry the reason they are not
// (not a regular file, a second module of a name already found). `taken` are names already in use
// (the built-in reference).
std::vector<backend_entry> find_plugins(const std::vector<std::string>& taken);
// Loads a pending entry's module in place; never throws or crashes on a bad module: failures are
// recorded in `reason`. Not thread-safe: the registry serializes calls.
void load_plugin(backend_entry& entry);

}  // namespace expanse::detail
