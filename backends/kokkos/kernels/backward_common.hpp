// What the Kokkos backward kernels share: f32 token buffers in the workspace (the gradients are summed
// there, then stored in their tensors' dtypes), and the cotangents of the queries' numerators and
// denominators.
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

// A contiguous f32 [b,t,heads,width] buffer (width 1: [b,t,heads]); null: absent.
struct token_buffer {
  float* data = nullptr;
  int64_t t = 0, heads = 0, width = 1;
  KOKKOS_INLINE_FUNCTION bool present() const { return data != nullptr; }
  KOKKOS_INLINE_FUNCTION float* row(int64_t batch, int64_t tok, int64_t head) const {
    return data + ((batch * t + tok) * heads + head) * width;
  }
};

// The cotangents of query i's numerator and denominator: dnum_i [e] and dden_i (absent: 0). In the
// normalized power attention also their inputs, dnum_i = r_i dout_i and dden_i = -r_i dout_i . o_i
// (r_i = 1 / den_i), from which the pairs take M_ij = dnum_i . v_j + dden_i as r_i dout_i . (v_j - o_i):
// for a query with a single key (o_i = v_j) that is exactly 0, where dnum and dden rounded apart
// leave eps |dout| |v| / den_i, which its tiny denominator (den_i = s_ii^2) turns into a large
// spurious gradient (dq 1.1e-5 relative on a case of the table, tolerance 1e-5).
struct query_cotangents {
  token_buffer dnum, dden;
  tensor_ref dout, o;  // absent: M from dnum, dden
  token_buffer r;      // [b,t,hq], with dout and o
};

// One team's staged cotangents of `count` queries (team_load_cotangents): a [count][e] is dout (exact
// form) or dnum, o [count][e] the outputs (exact form), w [count] r (exact form) or dden.
struct staged_cotangents {
  float *a, *o, *w;
  int64_t e;
  bool exact;
  // M_ij for query row `row` and the values v [e] of key j.
  KOKKOS_INLINE_FUNCTION float M(int64_t row, const float* v) const {
    float sum = 0.f;
    if (exact) {
      for (int64_t col = 0; col < e; ++col) sum += a[row * e + col] * (v[col] - o[row * e + col]);
      return w[row] * sum;
    }
    for (int64_t col = 0; col < e; ++col) sum += a[row * e + col] * v[col];
    return w[row] + sum;
  }
  KOKKOS_INLINE_FUNCTION float dnum(int64_t row, int64_t col) const { return exact ? w[row] * a[row * e + col] : a[row * e + col]; }
};

// For one token x [d] and one tile of phi's rows r0 .. r0 + rows - 1 (its phi values ph and the
// cotangents dphi of those rows): grad += J_phi(x)^T dphi, and returns phi(x) . dphi over the tile.
// Both in f64: each is a sum of D products that cancel, the first the gradient of x (in f32 a p = 4
// query's dq was 2e-4 off, 1.1e-5 over the case, tolerance 1e-5), the second the gates' term (in f32
// a p = 4 token's dlog_g was 6.6e-4 off where the sum in f64 is 1.6e-5 off).
KOKKOS_INLINE_FUNCTION double pull_back_tile(const phi_row* table, int64_t r0, int64_t rows, int p, const float* x,
                                             const float* ph, const float* dphi, double* grad) {
  double dot = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    dot += double(ph[r]) * dphi[r];
    add_phi_pullback(table[r0 + r], p, x, dphi[r], grad);
  }
  return dot;
}

// Stages the cotangents of queries tok0 .. tok0 + count - 1 of one head (staged_cotangents).
template <class Member>
KOKKOS_INLINE_FUNCTION void team_load_cotangents(const Member& team, const staged_cotangents& st, const query_cotangents& cot,
                                                 int64_t batch, int64_t tok0, int64_t head, int64_t count) {
  const int64_t e = st.e;
  if (st.exact) {
    team_load_rows(team, st.a, cot.dout, batch, tok0, head, count, e);
    team_load_rows(team, st.o, cot.o, batch, tok0, head, count, e);
  } else {
    team_for_2d(team, count, e, [&](int64_t row, int64_t col) { st.a[row * e + col] = cot.dnum.row(batch, tok0 + row, head)[col]; });
  }
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int64_t row) {
    const token_buffer& w = st.exact ? cot.r : cot.dden;
    st.w[row] = w.present() ? *w.row(batch, tok0 + row, head) : 0.f;
  });
}

template <class Space>
void launch_fill_zero(const Space& space, token_buffer buf, int64_t b) {
  float* data = buf.data;
  Kokkos::parallel_for("expanse::fill_zero", Kokkos::RangePolicy<Space>(space, 0, b * buf.t * buf.heads * buf.width),
                       KOKKOS_LAMBDA(int64_t i) { data[i] = 0.f; });
}

// The cotangents of the intra-chunk terms (y, l) and those of the true numerators and denominators
// (dnum, dden) differ by exp(rowmax): dnum_i = exp(-rowmax_i) dy_i, dden_i = exp(-rowmax_i) dl_i
// (to_intra false: chunk_attention_backward's inputs), dy_i = exp(rowmax_i) dnum_i and likewise dl
// (to_intra true: query_state_backward's outputs). Absent tensors are skipped.
template <class Space>
void launch_rowmax_scaling(const Space& space, tensor_ref rowmax, tensor_ref dy, tensor_ref dl, query_cotangents cot,
                           bool to_intra, int64_t b) {
  const int64_t t = cot.dnum.t, hq = cot.dnum.heads, e = cot.dnum.width;
  Kokkos::parallel_for(
      "expanse::rowmax_scaling", Kokkos::RangePolicy<Space>(space, 0, b * t * hq), KOKKOS_LAMBDA(int64_t i) {
        const int64_t head = i % hq, tok = (i / hq) % t, batch = i / (hq * t);
        const float rm = rowmax.get(rowmax.at(batch, tok, head)), f = math::exp(to_intra ? rm : -rm);
        float* dn = cot.dnum.row(batch, tok, head);
        for (int64_t col = 0; col < e; ++col) {
          const int64_t off = dy.at(batch, tok, head, col);
          if (to_intra) {
            if (dy.present()) dy.set(off, f * dn[col]);
          } else {
            dn[col] = f * dy.get(off);
          }
        }
        if (!cot.dden.present() || !dl.present()) return;
        float* dd = cot.dden.row(batch, tok, head);
        if (to_intra) dl.set(dl.at(batch, tok, head), f * *dd);
        else *dd = f * dl.get(dl.at(batch, tok, head));
      });
}

// dst [b,t,heads,width] (or [b,t,heads] for width 1, in its dtype) = src.
template <class Space>
void launch_store_tokens(const Space& space, token_buffer src, tensor_ref dst, int64_t b) {
  const int64_t t = src.t, heads = src.heads, width = src.width;
  Kokkos::parallel_for(
      "expanse::store_tokens", Kokkos::RangePolicy<Space>(space, 0, b * t * heads * width), KOKKOS_LAMBDA(int64_t i) {
        const int64_t col = i % width, head = (i / width) % heads, tok = (i / (width * heads)) % t,
                      batch = i / (width * heads * t);
        const int64_t off = width == 1 && dst.ndim == 3 ? dst.at(batch, tok, head) : dst.at(batch, tok, head, col);
        dst.set(off, src.data[i]);
      });
}

}  // namespace expanse_kokkos
