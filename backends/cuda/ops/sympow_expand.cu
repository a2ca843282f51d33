// sympow_expand: out[..., r] = phi_r(x[..., :]) for every leading index, any strides.
#include "ops/op_common.hpp"

namespace expanse_cuda {
namespace {

template <class T>
__global__ void sympow_expand_kernel(expanse_tensor x, expanse_tensor out, const phi_entry* table, int64_t rows,
                                     int64_t D, int p) {
  const int lead = x.ndim - 1;
  EXPANSE_GRID_LOOP(i, rows * D) {
    const int64_t r = i % D;
    int64_t rest = i / D, x_off = 0, out_off = 0;
    for (int dim = lead - 1; dim >= 0; --dim) {  // unravel the leading multi-index, row-major
      const int64_t k = rest % x.shape[dim];
      rest /= x.shape[dim];
      x_off += k * x.strides[dim];
      out_off += k * out.strides[dim];
    }
    const T* xs = static_cast<const T*>(x.data) + x_off;
    const int64_t xstride = x.strides[lead];
    const float v = phi_value(table[r], p, [&](int j) { return to_f32(xs[j * xstride]); });
    static_cast<T*>(out.data)[out_off + r * out.strides[lead]] = from_f32<T>(v);
  }
}

std::string simple_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = *static_cast<const expanse_sympow_expand_args*>(op.args);
  const phi_entry* table = make_phi_table(pb, lc);
  if (lc.ws.sizing() || pb.rows * pb.D == 0) return;
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    sympow_expand_kernel<T><<<grid_for(pb.rows * pb.D, 256), 256, 0, lc.stream>>>(*a.x, *a.out, table, pb.rows, pb.D, pb.p);
  });
  check_launch("sympow_expand");
}

const registered_list kList(cuda_lists(), EXPANSE_OP_SYMPOW_EXPAND,
                            {{"simple", expanse_sdk::any_device, simple_declines, simple_run}});

}  // namespace

}  // namespace expanse_cuda
