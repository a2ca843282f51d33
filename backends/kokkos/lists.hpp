// The Kokkos backend's implementation lists and the dispatcher over them (backends/sdk/).
#pragma once

#include "sdk/dispatcher.hpp"

namespace expanse_kokkos {

expanse_sdk::implementation_lists& kokkos_lists();
const expanse_sdk::dispatcher& kokkos_dispatcher();

}  // namespace expanse_kokkos
