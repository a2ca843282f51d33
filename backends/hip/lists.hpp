// The HIP backend's implementation lists and its dispatcher (EXPANSE_HIP_VERBOSE, EXPANSE_HIP_SKIP).
#pragma once

#include "sdk/dispatcher.hpp"
#include "sdk/implementation.hpp"

namespace expanse_hip {

expanse_sdk::implementation_lists& hip_lists();
const expanse_sdk::dispatcher& hip_dispatcher();

}  // namespace expanse_hip
