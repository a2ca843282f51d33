// The CUDA backend's dispatch, on the vendor-neutral SDK (backends/sdk/): the implementation lists
// each operation's file registers (ops/<name>.cu), the architecture tags of its implementations, and
// its dispatcher (EXPANSE_CUDA_VERBOSE, EXPANSE_CUDA_SKIP).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "sdk/dispatcher.hpp"
#include "sdk/implementation.hpp"
#include "sdk/op_args.hpp"

namespace expanse_cuda {

using expanse_sdk::args_of;
using expanse_sdk::device_props;
using expanse_sdk::implementation;
using expanse_sdk::launch_context;
using expanse_sdk::op_name;
using expanse_sdk::registered_list;
using expanse_sdk::workspace;

// The feature bits of device_props::features, set by backend.cpp for each device.
enum cuda_feature : uint32_t {
  kMmaSync = 1u << 0,  // tensor cores through mma.sync: compute capability 8.0 or newer
  kSm90a = 1u << 1,    // wgmma, TMA and clusters: a compute capability 9.0 device running this build's sm_90a code
};
// The architecture tags of the implementations (the folders kernels/sm80 and kernels/sm90).
inline constexpr expanse_sdk::requirement sm80{kMmaSync, "needs compute capability 8.0 or newer"};
inline constexpr expanse_sdk::requirement sm90a{kMmaSync | kSm90a,
                                                "needs a compute capability 9.0 device and this build's sm_90a code"};

// The lists, filled by the operations' files as the module loads, and the dispatcher on them.
expanse_sdk::implementation_lists& cuda_lists();
const expanse_sdk::dispatcher& cuda_dispatcher();

// Whether a compute capability 9.0 device runs this module's sm_90a code (arch_probe.cu).
bool sm90a_code_loads();

// power_attention's chunk size for EXPANSE_CHUNK_AUTO (0: the quadratic form), chunk_choice.cpp.
int64_t choose_chunk_size(const expanse_problem* problem);

}  // namespace expanse_cuda
