// power_attention on the CUDA backend: the chunked algorithm every GPU backend shares (each step
// through its own list; gpu/ops/power_attention.cu), then "fused" (the state kept on chip; P1's
// shapes; ops/power_attention_fused.cu). fused comes second because it is slower today (7.7 against
// 2.0 ms at P1, t = 65536; docs/fused.md): it runs where chunked is skipped
// (EXPANSE_CUDA_SKIP=chunked). Its exchanging call (context parallelism) is chunked's.
#include "dispatch.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_cuda {

// ops/power_attention_fused.cu
std::string fused_power_attention_declines(const expanse_op& op, const device_props& props);
void fused_power_attention_run(const expanse_op& op, launch_context& lc);

namespace {

const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION,
                            {expanse_gpu::power_attention_chunked,
                             {"fused", sm80, fused_power_attention_declines, fused_power_attention_run,
                              expanse_gpu::power_attention_chunked_run_exchanging}});

}  // namespace
}  // namespace expanse_cuda
