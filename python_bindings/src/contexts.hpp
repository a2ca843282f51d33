// One expanse_context per (backend, device) and thread. A context is not thread-safe (expanse.h), and
// every call sets its stream and workspace, so each Python thread keeps its own contexts.
#pragma once

#include <string>

#include "expanse/expanse.h"

namespace expanse_py {

// The calling thread's context for backend and device, created on first use. Raises the library's
// error (expanse.BackendError for a missing or unavailable backend) when it cannot be created.
expanse_context* context_for(const std::string& backend, int32_t device);

}  // namespace expanse_py
