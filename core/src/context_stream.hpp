// What other parts of the core read of a context (the struct is context.cpp's).
#pragma once

#include "expanse/expanse.h"

namespace expanse::detail {

// The stream the context's operations run on (expanse_context_set_stream; NULL: the default stream).
void* context_stream(const expanse_context* ctx);

}  // namespace expanse::detail
