// discumsum: Y_0 = Y_init (or 0), Y_{m+1} = exp(A_m) Y_m + X_m, a streaming scan over chunks with
// the running state in an f32 register: one thread per state element, reading X once and writing Y
// once (memory bound; consecutive threads touch consecutive elements).
#include "ops/op_common.hpp"
#include "ops/state_ops.hpp"

namespace expanse_cuda {
namespace {

constexpr int kAhead = 8;  // chunks whose loads are in flight together

// Offset of trailing element `elem` (row-major over dims 3..) in a tensor shaped like X.
__device__ __forceinline__ int64_t trailing_offset(const expanse_tensor& shape_of, const expanse_tensor& t,
                                                   int64_t elem) {
  int64_t off = 0;
  for (int dim = shape_of.ndim - 1; dim >= 3; --dim) {
    const int64_t i = elem % shape_of.shape[dim];
    elem /= shape_of.shape[dim];
    off += i * t.strides[dim];
  }
  return off;
}

template <class T>
__global__ void discumsum_kernel(expanse_tensor X, expanse_tensor A, expanse_tensor init, expanse_tensor Y,
                                 expanse_tensor fin, int64_t n, int64_t elems) {
  const int64_t b = X.shape[0], h = X.shape[2];
  EXPANSE_GRID_LOOP(i, b * h * elems) {
    const int64_t elem = i % elems, head = (i / elems) % h, batch = i / (elems * h);
    const int64_t xo = trailing_offset(X, X, elem), yo = trailing_offset(X, Y, elem);
    float y = init.data ? *ptrf(init, batch * init.strides[0] + head * init.strides[2] + trailing_offset(X, init, elem)) : 0.f;
    const T* xs = static_cast<const T*>(X.data) + batch * X.strides[0] + head * X.strides[2] + xo;
    float* ys = static_cast<float*>(Y.data) + batch * Y.strides[0] + head * Y.strides[2] + yo;
    // Chunks go in groups of kAhead: their X and A are loaded before any Y of the group is
    // written, so the loads overlap instead of waiting one by one (in place, Y_m overwrites X_m
    // only after X_m was read).
    for (int64_t m0 = 0; m0 < n; m0 += kAhead) {
      float x[kAhead], decay[kAhead];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int64_t m = m0 + j;
        x[j] = m < n ? to_f32(xs[m * X.strides[1]]) : 0.f;
        decay[j] = m < n && A.data ? expf(*ptrf(A, off3(A, batch, m, head))) : 1.f;
      }
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int64_t m = m0 + j;
        if (m >= n) break;
        ys[m * Y.strides[1]] = y;
        y = decay[j] * y + x[j];
      }
    }
    if (fin.data) *ptrf(fin, batch * fin.strides[0] + head * fin.strides[2] + trailing_offset(X, fin, elem)) = y;
  }
}

std::string declines(const expanse_op& op, const device_props&) {
  const auto& a = *static_cast<const expanse_discumsum_args*>(op.args);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.A) || !is_f32(a.Y_init) || !is_f32(a.Y))) why = "A, Y_init and Y must be f32";
  return why;
}

void run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = *static_cast<const expanse_discumsum_args*>(op.args);
  if (lc.ws.sizing()) return;
  expanse_tensor init{};
  if (a.Y_init) {  // [b,h,...] -> X's rank with a size-1 chunk axis
    const expanse_tensor& s = *a.Y_init;
    init = s;
    init.ndim = s.ndim + 1;
    init.shape[0] = s.shape[0]; init.strides[0] = s.strides[0];
    init.shape[1] = 1; init.strides[1] = 0;
    for (int i = 1; i < s.ndim; ++i) { init.shape[i + 1] = s.shape[i]; init.strides[i + 1] = s.strides[i]; }
  }
  expanse_tensor fin = *a.Y;  // slot n of Y
  fin.data = static_cast<float*>(a.Y->data) + pb.n * a.Y->strides[1];
  launch_discumsum(*a.X, *a.A, init, *a.Y, fin, pb.n, pb.input_dtype, lc.stream);
}

}  // namespace

void launch_discumsum(const expanse_tensor& X, const expanse_tensor& A, const expanse_tensor& init,
                      const expanse_tensor& Y, const expanse_tensor& final_state, int64_t n, int32_t input_dtype,
                      cudaStream_t stream) {
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

const std::vector<implementation>& discumsum_impls() {
  static const std::vector<implementation> list = {{"scan", declines, run}};
  return list;
}

}  // namespace expanse_cuda
