// What other parts of the core read of a context (the struct is context.cpp's), and the chunk size
// that context parallelism sums a piece's own state by.
#pragma once

#include "expanse/expanse.h"

namespace expanse::detail {

// The stream the context's operations run on (expanse_context_set_stream; NULL: the default stream).
void* context_stream(const expanse_context* ctx);

// The chunk size of sequence_state for a piece's own final state: the forward's (128 for the
// quadratic form), doubled until the piece has at most 256 chunks (each a D x e state while it runs).
int64_t own_state_chunk(expanse_context* ctx, const expanse_power_attention_args& a);

}  // namespace expanse::detail
