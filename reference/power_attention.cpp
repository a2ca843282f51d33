// power_attention (docs/spec.md "Gated power attention"): for query i and key j <= i,
//   A_ij = (scale q_i . k_j)^p exp(G_i - G_j),   G = inclusive cumsum of log_g over the sequence,
//   num_i = sum_j A_ij v_j [+ phi(scale q_i)^T S0 exp(G_i)]
//   den_i = sum_j A_ij     [+ phi(scale q_i)^T z0 exp(G_i)]
//   o_i = num_i / den_i (0 where den_i == 0) when normalized, else o_i = num_i;
// and the final state S_t = exp(G_t) S0 + sum_j exp(G_t - G_j) phi(k_j) v_j^T (z likewise).
//
// Two forms of the same function:
//  * quadratic (one chunk: chunk size 0, or one >= t): the A matrix directly, per (batch, query
//    head, row block);
//  * chunked (two chunks or more): SPEC "chunked algorithm", one sequential pass over the chunks
//    per (batch, kv head) with a running f64 state, as the fast kernels do it.
// Both compute in f64 directly (no log space is needed at this precision).
#include <cmath>
#include <memory>
#include <stdexcept>

#include "reference/common.hpp"
#include "reference/ops.hpp"
#include "reference/sympow.hpp"

namespace expanse_ref {
namespace {

// Causal term for the query rows i = i0 .. i0 + rows - 1 of a token range (the whole sequence, or
// one chunk), whose keys are the range's tokens j <= i:
//   num_r += sum_{j <= i} A_ij v_j,   den_r += sum_{j <= i} A_ij,   A_ij = (qs_i . k_j)^p exp(G_i - G_j).
// Qs: the scaled queries of those rows; K, V: the range's keys and values (at least i0 + rows of
// them); G: prefix sums of log_g over the range.
void add_causal_term(const Eigen::Ref<const RowMatrix>& Qs, const RowMatrix& K, const RowMatrix& V,
                     const PrefixSum& G, int p, int64_t i0, Eigen::Ref<RowMatrix> num, Eigen::Ref<Vector> den) {
  const int64_t rows = Qs.rows(), keys = i0 + rows;
  RowMatrix A = Qs * K.topRows(keys).transpose();  // scale q_i . k_j
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    for (int64_t j = 0; j < keys; ++j)
      A(r, j) = j <= i ? ipow(A(r, j), p) * std::exp(G.diff(i, j)) : 0.0;
  }
  num += A * V.topRows(keys);
  den += A.rowwise().sum();
}

// State term: num_r += decay_r phi(qs_r)^T S,  den_r += decay_r phi(qs_r)^T z.
void add_state_term(const RowMatrix& phiQ, const RowMatrix& S, const Vector& z, const Vector& decay,
                    RowMatrix& num, Vector& den) {
  num += decay.asDiagonal() * (phiQ * S);
  den += decay.asDiagonal() * (phiQ * z);
}

// The initial state of (batch bi, kv head hi), or zeros without one. z0 is zero when absent
// (allowed when not normalizing).
void load_initial_state(const expanse_problem& pb, const expanse_power_attention_args& args,
                        int64_t bi, int64_t hi, RowMatrix& S, Vector& z) {
  S = args.initial_S != nullptr ? gather_state(*args.initial_S, {bi, hi}) : RowMatrix::Zero(pb.D, pb.e);
  z = args.initial_z != nullptr ? gather_state_vector(*args.initial_z, {bi, hi}) : Vector::Zero(pb.D);
}

void store_final_state(const expanse_power_attention_args& args, int64_t bi, int64_t hi,
                       const RowMatrix& S, const Vector& z) {
  if (args.final_S != nullptr) scatter_state(*args.final_S, {bi, hi}, S);
  if (args.final_z != nullptr) scatter_state_vector(*args.final_z, {bi, hi}, z);
}

// ------------------------------------------------------------------ quadratic form

void power_attention_quadratic(const expanse_problem& pb, const expanse_power_attention_args& args) {
  const bool has_initial = args.initial_S != nullptr;
  const bool want_final = args.final_S != nullptr || args.final_z != nullptr;
  std::unique_ptr<FeatureMap> phi;  // only needed for the states
  if (has_initial || want_final) {
    phi = std::make_unique<FeatureMap>(pb.p, pb.d, pb.layout);
    if (phi->D() != pb.D) throw std::logic_error("reference: power_attention D mismatch");
  }

  // G over the whole sequence, per (batch, kv head).
  std::vector<PrefixSum> G;
  G.reserve(static_cast<size_t>(pb.b * pb.h));
  for (int64_t bi = 0; bi < pb.b; ++bi)
    for (int64_t hi = 0; hi < pb.h; ++hi) G.emplace_back(gather_log_g(args.log_g, bi, hi, 0, pb.t));

  // Outputs: one task per (batch, query head, block of query rows).
  const int64_t blocks = (pb.t + kRowBlock - 1) / kRowBlock;
  parallel_for_index(pb.b * pb.hq * blocks, [&](int64_t task) {
    const int64_t blk = task % blocks, qh = (task / blocks) % pb.hq, bi = task / (blocks * pb.hq);
    const int64_t kv = kv_head_of(pb, qh);
    const PrefixSum& g = G[bi * pb.h + kv];
    const int64_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, pb.t - i0);

    const RowMatrix Qs = pb.scale * gather_tokens(*args.q, bi, qh, i0, rows);
    const RowMatrix K = gather_tokens(*args.k, bi, kv, 0, i0 + rows);
    const RowMatrix V = gather_tokens(*args.v, bi, kv, 0, i0 + rows);
    RowMatrix num = RowMatrix::Zero(rows, pb.e);
    Vector den = Vector::Zero(rows);
    add_causal_term(Qs, K, V, g, pb.p, i0, num, den);

    if (has_initial) {  // + phi(scale q_i)^T S0 exp(G_i), likewise z0
      RowMatrix S0;
      Vector z0;
      load_initial_state(pb, args, bi, kv, S0, z0);
      Vector decay(rows);
      for (int64_t r = 0; r < rows; ++r) decay(r) = std::exp(g.at(i0 + r));
      add_state_term(phi->expand_rows(Qs), S0, z0, decay, num, den);
    }

    if (pb.normalize) divide_rows(num, den);
    scatter_tokens(*args.o, bi, qh, i0, num);
  });

  if (!want_final) return;
  // Final state: S_t = exp(G_t) S0 + sum_j exp(G_t - G_j) phi(k_j) v_j^T, per (batch, kv head),
  // accumulated over blocks of tokens to bound the memory of phi(K).
  parallel_for_index(pb.b * pb.h, [&](int64_t task) {
    const int64_t hi = task % pb.h, bi = task / pb.h;
    const PrefixSum& g = G[task];
    RowMatrix S;
    Vector z;
    load_initial_state(pb, args, bi, hi, S, z);
    const double total_decay = std::exp(g.total());
    S *= total_decay;
    z *= total_decay;
    for (int64_t j0 = 0; j0 < pb.t; j0 += kRowBlock) {
      const int64_t len = std::min(kRowBlock, pb.t - j0);
      const RowMatrix phiK = phi->expand_rows(gather_tokens(*args.k, bi, hi, j0, len));
      const RowMatrix V = gather_tokens(*args.v, bi, hi, j0, len);
      Vector w(len);  // exp(G_t - G_j)
      for (int64_t j = 0; j < len; ++j) w(j) = std::exp(g.to_end(j0 + j));
      S += phiK.transpose() * (w.asDiagonal() * V);
      z += phiK.transpose() * w;
    }
    store_final_state(args, bi, hi, S, z);
  });
}

// ------------------------------------------------------------------ chunked form

void power_attention_chunked(const expanse_problem& pb, const expanse_power_attention_args& args) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: power_attention D mismatch");
  const int64_t group = pb.hq / pb.h;  // query heads per kv head

  // One task per (batch, kv head): the chunks are visited in order, carrying the state.
  parallel_for_index(pb.b * pb.h, [&](int64_t task) {
    const int64_t kv = task % pb.h, bi = task / pb.h;
    RowMatrix S;  // state entering the current chunk [D x e], starts at the initial state
    Vector z;     // [D]
    load_initial_state(pb, args, bi, kv, S, z);

    for (int64_t m = 0; m < pb.n; ++m) {
      const ChunkRange ch = chunk_range(m, chunk_size_of(pb), pb.t);
      const PrefixSum Gc(gather_log_g(args.log_g, bi, kv, ch.first, ch.len));
      const RowMatrix K = gather_tokens(*args.k, bi, kv, ch.first, ch.len);
      const RowMatrix V = gather_tokens(*args.v, bi, kv, ch.first, ch.len);
      Vector decay(ch.len);  // exp(Gc_i): from the chunk start to token i
      for (int64_t i = 0; i < ch.len; ++i) decay(i) = std::exp(Gc.at(i));

      for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) {
        const RowMatrix Qs = pb.scale * gather_tokens(*args.q, bi, qh, ch.first, ch.len);
        RowMatrix num = RowMatrix::Zero(ch.len, pb.e);
        Vector den = Vector::Zero(ch.len);
        // Inter-chunk: phi(scale q_i)^T S exp(Gc_i), likewise z.
        add_state_term(phi.expand_rows(Qs), S, z, decay, num, den);
        // Intra-chunk: the causal A inside the chunk, in blocks of query rows.
        for (int64_t i0 = 0; i0 < ch.len; i0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, ch.len - i0);
          add_causal_term(Qs.middleRows(i0, rows), K, V, Gc, pb.p, i0, num.middleRows(i0, rows),
                          den.segment(i0, rows));
        }
        if (pb.normalize) divide_rows(num, den);
        scatter_tokens(*args.o, bi, qh, ch.first, num);
      }

      // State update: S <- exp(A_m) S + sum_j exp(A_m - Gc_j) phi(k_j) v_j^T, likewise z.
      const RowMatrix phiK = phi.expand_rows(K);
      Vector w(ch.len);
      for (int64_t j = 0; j < ch.len; ++j) w(j) = std::exp(Gc.to_end(j));
      const double chunk_decay = std::exp(Gc.total());
      S = chunk_decay * S + phiK.transpose() * (w.asDiagonal() * V);
      z = chunk_decay * z + phiK.transpose() * w;
    }
    store_final_state(args, bi, kv, S, z);
  });
}

}  // namespace

void power_attention(const expanse_problem& pb, const expanse_power_attention_args& args) {
  if (pb.n <= 1)  // the quadratic form, or one chunk spanning the sequence: the same function
    power_attention_quadratic(pb, args);
  else
    power_attention_chunked(pb, args);
}

}  // namespace expanse_ref
