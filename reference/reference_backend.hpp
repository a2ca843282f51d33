// The built-in CPU reference backend: the oracle every other backend is checked against.
// Internal to libexpanse.so (the core registers it first in its backend registry).
#ifndef EXPANSE_REFERENCE_BACKEND_HPP
#define EXPANSE_REFERENCE_BACKEND_HPP

#include "expanse/backend.h"

// The reference backend's table (static storage, valid for the life of the library).
extern "C++" const expanse_backend* expanse_reference_backend();

#endif  // EXPANSE_REFERENCE_BACKEND_HPP
