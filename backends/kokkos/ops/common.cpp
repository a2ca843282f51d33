#include "kokkos/ops/common.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "kokkos/kernels/gates.hpp"

namespace expanse_kokkos {
namespace {

// sqrt(p! / prod_k hist_k!) of a non-decreasing multi-index, the count in integers (exact).
double symmetric_coef(const std::vector<int32_t>& idx) {
  int64_t count = 1;
  for (size_t i = 0; i < idx.size(); ++i) count *= int64_t(i + 1);
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j < idx.size() && idx[j] == idx[i]) ++j;
    for (size_t k = 2; k <= j - i; ++k) count /= int64_t(k);
    i = j;
  }
  return std::sqrt(double(count));
}

// Calls f(idx) for each multi-index of length p over [0, n) in lexicographic order (only the
// non-decreasing ones when asked).
template <class F>
void each_index(int p, int64_t n, bool nondecreasing, F&& f) {
  std::vector<int32_t> idx(size_t(p), 0);
  while (true) {
    f(idx);
    int k = p - 1;
    while (k >= 0 && idx[size_t(k)] == n - 1) --k;
    if (k < 0) return;
    ++idx[size_t(k)];
    for (int j = k + 1; j < p; ++j) idx[size_t(j)] = nondecreasing ? idx[size_t(k)] : 0;
  }
}

// docs/spec.md's three layouts, entry by entry.
std::vector<phi_row> phi_rows(int p, int64_t d, expanse_layout layout) {
  std::vector<phi_row> rows;
  auto add = [&](const std::vector<int32_t>& idx, double coef) {
    phi_row row{};
    for (int k = 0; k < p; ++k) row.idx[k] = idx[size_t(k)];
    row.coef = coef;
    rows.push_back(row);
  };
  if (layout.kind == EXPANSE_LAYOUT_TILED) {
    const int64_t dt = layout.d_tile;
    each_index(p, d / dt, true, [&](const std::vector<int32_t>& tiles) {
      const double coef = symmetric_coef(tiles);
      each_index(p, dt, false, [&](const std::vector<int32_t>& local) {
        std::vector<int32_t> idx(tiles.size());
        for (int k = 0; k < p; ++k) idx[size_t(k)] = int32_t(tiles[size_t(k)] * dt + local[size_t(k)]);
        add(idx, coef);
      });
    });
  } else if (layout.kind == EXPANSE_LAYOUT_TENSOR) {
    each_index(p, d, false, [&](const std::vector<int32_t>& idx) { add(idx, 1.0); });
  } else {
    each_index(p, d, true, [&](const std::vector<int32_t>& idx) { add(idx, symmetric_coef(idx)); });
  }
  return rows;
}

}  // namespace

std::string common_declines(const expanse_op& op) {
  const expanse_problem& pb = *op.problem;
  if (pb.input_dtype == EXPANSE_F64 || pb.output_dtype == EXPANSE_F64 || pb.state_dtype == EXPANSE_F64)
    return "f64 tensors are not supported (f64 is the reference backend's oracle mode)";
  if (pb.p > kMaxDegree) return "p must be at most " + std::to_string(kMaxDegree);
  return {};
}

const phi_row* make_phi_table(const expanse_problem& pb, const expanse_op& op, launch_context& lc) {
  phi_row* table = lc.ws.take<phi_row>(size_t(pb.D));
  if (lc.ws.sizing()) return table;
  const std::vector<phi_row> rows = phi_rows(pb.p, pb.d, pb.layout);
  if (int64_t(rows.size()) != pb.D) throw std::logic_error("kokkos: the phi table's size is not D");
  with_space(expanse_sdk::device_of(op), [&](auto tag) {
    using memory = typename decltype(tag)::memory_space;
    using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
    Kokkos::deep_copy(Kokkos::View<phi_row*, memory, unmanaged>(table, rows.size()),
                      Kokkos::View<const phi_row*, Kokkos::HostSpace, unmanaged>(rows.data(), rows.size()));
  });
  return table;
}

tensor_ref f32_buffer(float* data, std::initializer_list<int64_t> shape) {
  tensor_ref t;
  t.data = data;
  t.dtype = EXPANSE_F32;
  t.ndim = int32_t(shape.size());
  int64_t stride = 1;
  for (int dim = t.ndim - 1; dim >= 0; --dim) {
    t.stride[dim] = stride;
    stride *= shape.begin()[dim];
  }
  return t;
}

token_buffer take_tokens(launch_context& lc, int64_t b, int64_t t, int64_t heads, int64_t width, bool wanted) {
  token_buffer buf;
  if (!wanted) return buf;
  buf.data = lc.ws.take<float>(size_t(b * t * heads * width));
  buf.t = t;
  buf.heads = heads;
  buf.width = width;
  return buf;
}

tensor_ref tensor_of(const token_buffer& buf, int64_t b) {
  if (!buf.present()) return {};
  return buf.width == 1 ? f32_buffer(buf.data, {b, buf.t, buf.heads}) : f32_buffer(buf.data, {b, buf.t, buf.heads, buf.width});
}

gate_sums make_gate_sums(const expanse_tensor* log_g, const expanse_problem& pb, const expanse_op& op,
                         launch_context& lc) {
  gate_sums g;
  if (log_g == nullptr) return g;
  const size_t tokens = size_t(pb.b * pb.h * pb.t);
  double* since = lc.ws.take<double>(tokens);
  int32_t* reset = lc.ws.take<int32_t>(tokens);
  g.since = since;
  g.reset = reset;
  g.t = pb.t;
  g.c = pb.c;
  if (lc.ws.sizing() || tokens == 0) return g;
  on_space(op, lc, [&](auto space) { launch_gate_sums(space, tensor_ref(log_g), pb.b, pb.t, pb.h, pb.c, since, reset); });
  return g;
}

}  // namespace expanse_kokkos
