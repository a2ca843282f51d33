// discumsum: the streaming scan over chunks (gpu/kernels/discumsum.hpp), for the public operation
// and for power_attention's step (discumsum_step_args).
#include "gpu/kernels/backward_simple.hpp"
#include "gpu/kernels/discumsum.hpp"
#include "gpu/ops/discumsum.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {
namespace {

// A [b,h,...] state as a [b,1,h,...] view (the kernel's init/final form); empty when absent.
expanse_tensor with_chunk_axis(const expanse_tensor* s) {
  expanse_tensor t{};
  if (s == nullptr) return t;
  t = *s;
  t.ndim = s->ndim + 1;
  t.shape[0] = s->shape[0];
  t.strides[0] = s->strides[0];
  t.shape[1] = 1;
  t.strides[1] = 0;
  for (int i = 1; i < s->ndim; ++i) {
    t.shape[i + 1] = s->shape[i];
    t.strides[i + 1] = s->strides[i];
  }
  return t;
}

// Enqueues the scan of n chunks of X into Y: for m < n, Y_m (the state entering chunk m) goes to Y's
// slot m and Y_n to final_state (when its data is non-null). X and Y may be the same memory (in
// place). init has X's rank with a size-1 chunk axis (data null: 0).
void launch_discumsum(const expanse_tensor& X, const expanse_tensor& A, const expanse_tensor& init,
                      const expanse_tensor& Y, const expanse_tensor& final_state, int64_t n, int32_t input_dtype,
                      stream_t stream) {
  int64_t elems = 1;
  for (int dim = 3; dim < X.ndim; ++dim) elems *= X.shape[dim];
  const int64_t work = X.shape[0] * X.shape[2] * elems;
  if (work == 0) return;
  with_input_type(input_dtype, [&](auto tag) {
    using T = decltype(tag);
    discumsum_kernel<T><<<grid_for(work, 256), 256, 0, stream>>>(X, A, init, Y, final_state, n, elems);
  });
  check_launch("discumsum");
}

}  // namespace

std::string discumsum_scan_declines(const expanse_op& op, const device_props&) {
  const auto& a = args_of<expanse_discumsum_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.A) || !is_f32(a.Y_init) || !is_f32(a.Y))) why = "A, Y_init and Y must be f32";
  return why;
}

void discumsum_scan_run(const expanse_op& op, launch_context& lc) {
  if (lc.ws.sizing()) return;
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_discumsum_args>(op);
  const expanse_tensor A = a.A ? *a.A : expanse_tensor{};
  if (pb.want_final_state) {  // power_attention's step
    const auto& step = args_of<discumsum_step_args>(op);
    launch_discumsum(*a.X, A, with_chunk_axis(a.Y_init), *a.Y, with_chunk_axis(step.final_state), pb.n, pb.input_dtype,
                     lc.stream);
    return;
  }
  expanse_tensor last = *a.Y;  // the public operation: Y_n in Y's slot n
  last.data = static_cast<float*>(a.Y->data) + pb.n * a.Y->strides[1];
  launch_discumsum(*a.X, A, with_chunk_axis(a.Y_init), *a.Y, last, pb.n, pb.input_dtype, lc.stream);
}

void launch_add_initial(const expanse_tensor& Y, const expanse_tensor& A, const expanse_tensor& init, int64_t n,
                        stream_t stream) {
  int64_t elems = 1;
  for (int dim = 3; dim < Y.ndim; ++dim) elems *= Y.shape[dim];
  const int64_t blocks = Y.shape[0] * Y.shape[2] * n;
  if (blocks == 0 || elems == 0) return;
  const unsigned grid = grid_for(blocks * kAddInitialThreads, kAddInitialThreads);  // the kernel strides over the rest
  const expanse_tensor at_chunk = with_chunk_axis(&init);
  if (dense_from(Y, 3) && dense_from(at_chunk, 3))
    add_initial_kernel<true><<<grid, kAddInitialThreads, 0, stream>>>(Y, A, at_chunk, n, elems);
  else
    add_initial_kernel<false><<<grid, kAddInitialThreads, 0, stream>>>(Y, A, at_chunk, n, elems);
  check_launch("add initial state");
}

// discumsum_backward: Y recomputed per element into the workspace, then the reverse scan
// (gpu/kernels/backward_simple.hpp); dA summed in the workspace and copied out.
std::string discumsum_backward_simple_declines(const expanse_op& op, const device_props&) {
  const auto& a = args_of<expanse_discumsum_backward_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.A) || !is_f32(a.Y_init) || !is_f32(a.dY) || !is_f32(a.dA) || !is_f32(a.dY_init)))
    why = "A, Y_init, dY, dA and dY_init must be f32";
  return why;
}

void discumsum_backward_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_discumsum_backward_args>(op);
  const expanse_tensor& X = *a.X;
  int64_t elems = 1;
  for (int dim = 3; dim < X.ndim; ++dim) elems *= X.shape[dim];
  const int64_t heads = X.shape[0] * X.shape[2], sums = X.shape[0] * pb.n * X.shape[2];
  float* dA = lc.ws.take<float>(size_t(sums));
  float* Y = lc.ws.take<float>(size_t(heads * (pb.n + 1) * elems));
  if (lc.ws.sizing()) return;
  if (sums > 0) zero_kernel<<<grid_for(sums, 256), 256, 0, lc.stream>>>(dA, sums);
  if (heads * elems > 0)
    with_input_type(pb.input_dtype, [&](auto tag) {
      using T = decltype(tag);
      const int64_t groups = heads * ((elems + kLaneGroup - 1) / kLaneGroup);
      discumsum_backward_kernel<T><<<grid_for(groups * kLaneGroup, 256), 256, 0, lc.stream>>>(
          X, *a.A, with_chunk_axis(a.Y_init), *a.dY, *a.dX, dA, with_chunk_axis(a.dY_init), Y, pb.n, elems);
    });
  if (a.dA && sums > 0) copy_to_tensor3_kernel<<<grid_for(sums, 256), 256, 0, lc.stream>>>(dA, *a.dA);
  check_launch("discumsum_backward");
}

}  // namespace expanse_gpu
