// The opt-in scan of an operation's inputs for NaN and infinities (expanse_context_set_check_finite).
// Runs after validation, so every tensor it reads is known to be well formed.
#pragma once

#include <functional>
#include <vector>

#include "op_table.hpp"

namespace expanse::detail {

// Copies `bytes` bytes of device memory at `device_ptr` to the host (and waits for them).
using fetch_fn = std::function<std::vector<unsigned char>(const void* device_ptr, size_t bytes)>;

// Throws api_error(EXPANSE_ERROR_INVALID_ARGUMENT) naming the first input (in table order) that holds
// a NaN or an infinity, and the index of that element. `fetch` is null when the tensors are in host
// memory.
void check_finite_inputs(const char* op, const op_decl& decl, const void* args, const fetch_fn* fetch);

}  // namespace expanse::detail
