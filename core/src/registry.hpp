// The backend registry: the built-in reference plus every plugin module found at first use.
#pragma once

#include <string>
#include <vector>

#include "expanse/backend.h"

namespace expanse::detail {

struct backend_entry {
  std::string name;
  std::string path;    // module file; empty for the built-in reference
  std::string reason;  // why it is unavailable; empty when available
  const expanse_backend* table = nullptr;  // null when loading failed
  uint32_t abi_version = 0;
  int32_t device_count = 0;
  bool available() const { return table != nullptr && reason.empty(); }
};

// All backends in discovery order (reference first). Discovery runs once, thread-safely.
const std::vector<backend_entry>& backends();
// The entry named `name`, or nullptr.
const backend_entry* find_backend(const std::string& name);

}  // namespace expanse::detail
