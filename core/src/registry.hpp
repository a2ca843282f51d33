// The backend registry: the built-in reference plus the plugin modules found beside libexpanse.so
// and on $EXPANSE_BACKEND_PATH. A module is loaded only when its backend is asked for by name or
// when the whole list is asked for; the reference never loads one.
#pragma once

#include <string>
#include <vector>

#include "expanse/backend.h"

namespace expanse::detail {

struct backend_entry {
  // skipped: never to be loaded (reason says why); pending: found, not loaded yet; loaded: the
  // module was loaded (or attempted: reason says what failed), or the built-in reference.
  enum class state { skipped, pending, loaded };

  std::string name;    // from the file name libexpanse-<name>.so (the module's table must agree)
  std::string path;    // module file; empty for the built-in reference
  std::string reason;  // why it is unavailable; empty when available
  const expanse_backend* table = nullptr;  // null when loading failed
  uint32_t abi_version = 0;
  int32_t device_count = 0;
  state status = state::skipped;
  bool available() const { return table != nullptr && reason.empty(); }
};

// All backends in discovery order (reference first), every pending module loaded first. Thread-safe.
const std::vector<backend_entry>& backends();
// The backend named `name` with its module loaded (only that one), or nullptr. Thread-safe; the
// entry's address is stable for the life of the process.
const backend_entry* find_backend(const std::string& name);

}  // namespace expanse::detail
