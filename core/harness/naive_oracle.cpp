// The independent naive f64 oracle (see naive_oracle.hpp). Written directly from docs/spec.md with plain
// nested loops and simple recursion; clarity over speed. Shares no code with the reference backend.
#include "naive_oracle.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>

namespace expanse::harness::naive {

namespace {

// Extended precision (64-bit mantissa on x86): the recurrent form computes (q.k)^p as a long sum
// over D terms of mixed sign, which loses digits when q and k are nearly orthogonal; the extra bits
// keep the oracle's own error well below the 1e-12 it checks the reference against.
using real = long double;

real factorial(int n) {
  real f = 1;
  for (int i = 2; i <= n; ++i) f *= i;
  return f;
}

// sqrt(p! / prod_k hist_k!) for a non-decreasing multi-index idx (|idx| = p).
real sym_coef(const std::vector<int64_t>& idx) {
  real denom = 1;
  size_t run = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    run = (i > 0 && idx[i] == idx[i - 1]) ? run + 1 : 1;
    denom *= static_cast<real>(run);  // product of 1..hist_k over each run = prod hist_k!
  }
  return std::sqrt(factorial(static_cast<int>(idx.size())) / denom);
}

// Calls f(idx) for every multi-index of length p over [0, n) in lexicographic order; if
// nondecreasing, only those with idx[0] <= idx[1] <= ... <= idx[p-1].
void enumerate(int32_t p, int64_t n, bool nondecreasing, const std::function<void(const std::vector<int64_t>&)>& f) {
  std::vector<int64_t> idx(static_cast<size_t>(p), 0);
  std::function<void(int32_t, int64_t)> rec = [&](int32_t pos, int64_t lo) {
    if (pos == p) {
      f(idx);
      return;
    }
    for (int64_t i = nondecreasing ? lo : 0; i < n; ++i) {
      idx[static_cast<size_t>(pos)] = i;
      rec(pos + 1, i);
    }
  };
  rec(0, 0);
}

// All inputs read once as f64 (host_tensor::get handles every dtype).
struct reader {
  std::map<std::string, std::vector<real>> data;
  explicit reader(const tensor_map& in) {
    for (const auto& kv : in) {
      std::vector<real> v(static_cast<size_t>(kv.second.numel()));
      for (int64_t i = 0; i < kv.second.numel(); ++i) v[static_cast<size_t>(i)] = kv.second.get(i);
      data[kv.first] = std::move(v);
    }
  }
  bool has(const std::string& name) const { return data.count(name) > 0; }
  const std::vector<real>& tensor(const std::string& name) const {
    auto it = data.find(name);
    if (it == data.end()) throw std::invalid_argument("naive oracle: missing input " + name);
    return it->second;
  }
  real at(const std::string& name, int64_t i) const {
    const std::vector<real>& v = tensor(name);
    if (i < 0 || i >= static_cast<int64_t>(v.size())) throw std::invalid_argument("naive oracle: index out of range in " + name);
    return v[static_cast<size_t>(i)];
  }
  std::vector<real> vec(const std::string& name, int64_t offset, int64_t len) const {
    std::vector<real> v(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) v[static_cast<size_t>(i)] = at(name, offset + i);
    return v;
  }
};

real dot(const std::vector<real>& a, const std::vector<real>& b) {
  real s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<real> scaled(std::vector<real> x, real s) {
  for (real& v : x) v *= s;
  return x;
}

}  // namespace

// phi over any number type R that multiplies (real, or dual below for its derivatives).
template <class R>
std::vector<R> phi_of(const std::vector<R>& x, int32_t p, expanse_layout layout) {
  if (p < 1) throw std::invalid_argument("naive oracle: p must be >= 1");
  const int64_t d = static_cast<int64_t>(x.size());
  std::vector<R> out;
  if (p == 1) return x;
  if (layout.kind == EXPANSE_LAYOUT_SYMPOW) {
    enumerate(p, d, true, [&](const std::vector<int64_t>& idx) {
      R v = R(sym_coef(idx));
      for (int64_t i : idx) v *= x[static_cast<size_t>(i)];
      out.push_back(v);
    });
  } else if (layout.kind == EXPANSE_LAYOUT_TILED) {
    const int64_t dt = layout.d_tile;
    if (dt <= 0 || d % dt != 0) throw std::invalid_argument("naive oracle: d % d_tile != 0");
    enumerate(p, d / dt, true, [&](const std::vector<int64_t>& tiles) {
      const real coef = sym_coef(tiles);
      enumerate(p, dt, false, [&](const std::vector<int64_t>& local) {
        R v = R(coef);
        for (size_t k = 0; k < local.size(); ++k) v *= x[static_cast<size_t>(tiles[k] * dt + local[k])];
        out.push_back(v);
      });
    });
  } else if (layout.kind == EXPANSE_LAYOUT_TENSOR) {
    enumerate(p, d, false, [&](const std::vector<int64_t>& idx) {
      R v = R(1);
      for (int64_t i : idx) v *= x[static_cast<size_t>(i)];
      out.push_back(v);
    });
  } else {
    throw std::invalid_argument("naive oracle: unknown layout");
  }
  return out;
}

std::vector<real> phi_ext(const std::vector<real>& x, int32_t p, expanse_layout layout) { return phi_of(x, p, layout); }

namespace {

// a + b eps with eps^2 = 0: phi evaluated at x + eps e_k has column k of phi's Jacobian as its eps
// part, with none of the reference's hand-written pullback.
struct dual {
  real a = 0, b = 0;
  dual() = default;
  explicit dual(real value, real slope = 0) : a(value), b(slope) {}
  dual& operator*=(const dual& y) {
    b = a * y.b + b * y.a;
    a *= y.a;
    return *this;
  }
};

// J_phi(x)^T dphi: coordinate k is the derivative of <phi(x), dphi> along x_k.
std::vector<real> phi_pullback(const std::vector<real>& x, const std::vector<real>& dphi, int32_t p,
                               expanse_layout layout) {
  std::vector<real> dx(x.size(), 0.0);
  for (size_t k = 0; k < x.size(); ++k) {
    std::vector<dual> xd;
    for (size_t i = 0; i < x.size(); ++i) xd.emplace_back(x[i], i == k ? 1.0 : 0.0);
    const std::vector<dual> f = phi_of(xd, p, layout);
    for (size_t a = 0; a < f.size(); ++a) dx[k] += f[a].b * dphi[a];
  }
  return dx;
}

}  // namespace

std::vector<double> phi(const std::vector<double>& x, int32_t p, expanse_layout layout) {
  const std::vector<real> f = phi_ext(std::vector<real>(x.begin(), x.end()), p, layout);
  return std::vector<double>(f.begin(), f.end());
}

namespace {

// One problem's inputs and sizes, shared by the operations below (each a member named after its
// operation, reached through EXPANSE_OPERATIONS in run()).
struct problem {
  const op_config& cfg;
  const reader in;
  const int64_t b, t, hq, h, d, e;
  const int32_t p;
  const int64_t r;
  const real scale;
  const int64_t D;
  const bool gated;

  problem(const op_config& c, const tensor_map& inputs)
      : cfg(c), in(inputs), b(c.b), t(c.t), hq(c.hq), h(c.h), d(c.d), e(c.e), p(c.p), r(h > 0 ? hq / h : 1),
        scale(c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<real>(d))),
        D(static_cast<int64_t>(phi_ext(std::vector<real>(static_cast<size_t>(d), 0.0), p, c.layout).size())),
        gated(c.gated && in.has("log_g")) {}

  // Token-tensor offsets (contiguous row-major).
  int64_t qoff(int64_t bi, int64_t ti, int64_t hi) const { return ((bi * t + ti) * hq + hi) * d; }
  int64_t koff(int64_t bi, int64_t ti, int64_t hi) const { return ((bi * t + ti) * h + hi) * d; }
  int64_t voff(int64_t bi, int64_t ti, int64_t hi) const { return ((bi * t + ti) * h + hi) * e; }
  real logg(int64_t bi, int64_t ti, int64_t hi) const { return gated ? in.at("log_g", (bi * t + ti) * h + hi) : 0.0; }
  // Gc: inclusive cumsum of log_g within the chunk of size c (c <= 0: the whole sequence).
  std::vector<real> chunk_cumsum(int64_t bi, int64_t hi, int64_t c) const {
    std::vector<real> Gc(static_cast<size_t>(t));
    real acc = 0;
    for (int64_t ti = 0; ti < t; ++ti) {
      if (c > 0 && ti % c == 0) acc = 0;
      acc += logg(bi, ti, hi);
      Gc[static_cast<size_t>(ti)] = acc;
    }
    return Gc;
  }
  // The log of the decay from token j to token i (j <= i): the sum of log_g over (j, i], straight from
  // the definition, so that a reset (log_g = -inf) in between makes it -inf and nothing else does.
  real log_decay(int64_t bi, int64_t hi, int64_t j, int64_t i) const {
    real sum = 0;
    for (int64_t l = j + 1; l <= i; ++l) sum += logg(bi, l, hi);
    return sum;
  }

  // One token of the recurrence: S <- g S + phi(k) v^T and z <- g z + phi(k), with k and v read at
  // the element offsets k_at and v_at.
  void advance(std::vector<real>& S, std::vector<real>& z, real g, int64_t k_at, int64_t v_at) const {
    const std::vector<real> fk = phi_ext(in.vec("k", k_at, d), p, cfg.layout);
    const std::vector<real> vj = in.vec("v", v_at, e);
    for (int64_t x = 0; x < D; ++x) {
      z[size_t(x)] = g * z[size_t(x)] + fk[size_t(x)];
      for (int64_t y = 0; y < e; ++y) S[size_t(x * e + y)] = g * S[size_t(x * e + y)] + fk[size_t(x)] * vj[size_t(y)];
    }
  }

  // Query qs's pairs with the keys j <= ti of (bi, hi), in sequences of T tokens, summed in the
  // token domain: den = sum_j w_j and num = sum_j w_j v_j, w_j = exp(sum of log_g over (j, ti])
  // (s q . k_j)^p; and state_decay = exp(sum of log_g over [0, ti]), the decay of the state before
  // token 0. Not as phi(q) . z_ti: the same value, but that dot product is a sum of D terms of mixed
  // sign whose cancellation loses digits where den is a few terms of nearly orthogonal q and k.
  struct pair_sums {
    real den = 0, state_decay = 1;
    std::vector<real> num;
  };
  pair_sums causal_pair_sums(int64_t bi, int64_t hi, int64_t ti, int64_t T, const std::vector<real>& qs) const {
    pair_sums sums;
    sums.num.assign(static_cast<size_t>(e), 0.0);
    real log_w = 0;  // the sum of log_g over (j, ti]
    for (int64_t j = ti; j >= 0; --j) {
      const int64_t kv = (bi * T + j) * h + hi;
      const std::vector<real> vj = in.vec("v", kv * e, e);
      const real w = std::exp(log_w) * std::pow(dot(qs, in.vec("k", kv * d, d)), p);
      sums.den += w;
      for (int64_t y = 0; y < e; ++y) sums.num[static_cast<size_t>(y)] += w * vj[static_cast<size_t>(y)];
      if (gated) log_w += in.at("log_g", kv);
    }
    sums.state_decay = std::exp(log_w);
    return sums;
  }

  tensor_map sympow_expand() const {
    tensor_map out;
    host_tensor o = host_tensor::zeros(EXPANSE_F64, {t, D});
    for (int64_t row = 0; row < t; ++row) {
      const std::vector<real> f = phi_ext(in.vec("x", row * d, d), p, cfg.layout);
      for (int64_t j = 0; j < D; ++j) o.set(row * D + j, f[static_cast<size_t>(j)]);
    }
    out["out"] = std::move(o);
    return out;
  }

  tensor_map update_state() const {
    tensor_map out;
    const int64_t c = cfg.c;
    if (c < 1) throw std::invalid_argument("naive oracle: update_state needs c >= 1");
    const int64_t n = chunk_count(t, c);
    std::vector<real> S(static_cast<size_t>(b * n * h * D * e), 0.0), z(static_cast<size_t>(b * n * h * D), 0.0);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        for (int64_t m = 0; m < n; ++m) {
          const int64_t first = m * c, last = std::min(t, first + c) - 1;
          const int64_t so = ((bi * n + m) * h + hi) * D;
          for (int64_t j = first; j <= last; ++j) {
            const real w = std::exp(log_decay(bi, hi, j, last));  // exp(A_m - Gc_j)
            const std::vector<real> fk = phi_ext(in.vec("k", koff(bi, j, hi), d), p, cfg.layout);
            const std::vector<real> vj = in.vec("v", voff(bi, j, hi), e);
            for (int64_t x = 0; x < D; ++x) {
              const real fx = w * fk[static_cast<size_t>(x)];
              z[static_cast<size_t>(so + x)] += fx;
              for (int64_t y = 0; y < e; ++y) S[static_cast<size_t>((so + x) * e + y)] += fx * vj[static_cast<size_t>(y)];
            }
          }
        }
      }
    out["S"] = host_tensor::zeros(EXPANSE_F64, {b, n, h, D, e});
    out["z"] = host_tensor::zeros(EXPANSE_F64, {b, n, h, D});
    for (size_t i = 0; i < S.size(); ++i) out["S"].set(static_cast<int64_t>(i), S[i]);
    for (size_t i = 0; i < z.size(); ++i) out["z"].set(static_cast<int64_t>(i), z[i]);
    return out;
  }

  tensor_map discumsum() const {
    tensor_map out;
    const int64_t c = cfg.c;
    if (c < 1) throw std::invalid_argument("naive oracle: discumsum needs c >= 1");
    const int64_t n = chunk_count(t, c);
    const int64_t inner = d * e;
    host_tensor Y = host_tensor::zeros(EXPANSE_F64, {b, n + 1, h, d, e});
    const bool has_init = cfg.initial_state && in.has("Y_init");
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        std::vector<real> cur(static_cast<size_t>(inner), 0.0);
        if (has_init) cur = in.vec("Y_init", (bi * h + hi) * inner, inner);
        for (int64_t m = 0; m <= n; ++m) {
          for (int64_t x = 0; x < inner; ++x) Y.set(((bi * (n + 1) + m) * h + hi) * inner + x, cur[static_cast<size_t>(x)]);
          if (m == n) break;
          const real g = std::exp(in.at("A", (bi * n + m) * h + hi));
          for (int64_t x = 0; x < inner; ++x)
            cur[static_cast<size_t>(x)] = g * cur[static_cast<size_t>(x)] + in.at("X", ((bi * n + m) * h + hi) * inner + x);
        }
      }
    out["Y"] = std::move(Y);
    return out;
  }

  tensor_map query_state() const {
    tensor_map out;
    const int64_t c = cfg.c > 0 ? cfg.c : t;
    const int64_t n = chunk_count(t, c);
    host_tensor o = host_tensor::zeros(EXPANSE_F64, {b, t, hq, e});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t qi = 0; qi < hq; ++qi) {
        const int64_t hi = qi / r;
        const std::vector<real> Gc = chunk_cumsum(bi, hi, c);
        for (int64_t ti = 0; ti < t; ++ti) {
          const int64_t m = ti / c;
          const real w = std::exp(Gc[static_cast<size_t>(ti)]);
          const std::vector<real> fq = phi_ext(scaled(in.vec("q", qoff(bi, ti, qi), d), scale), p, cfg.layout);
          const int64_t so = ((bi * n + m) * h + hi) * D;
          std::vector<real> num(static_cast<size_t>(e), 0.0);
          real den = 0;
          const std::vector<real>& Sv = in.tensor("S");
          for (int64_t x = 0; x < D; ++x) {
            for (int64_t y = 0; y < e; ++y) num[static_cast<size_t>(y)] += fq[static_cast<size_t>(x)] * Sv.at(static_cast<size_t>((so + x) * e + y));
            if (cfg.normalize) den += fq[static_cast<size_t>(x)] * in.at("z", so + x);
          }
          for (real& v : num) v *= w;
          den *= w;
          const int64_t row = (bi * t + ti) * hq + qi;
          if (cfg.intra) {
            const real em = std::exp(in.at("rowmax", row));
            for (int64_t y = 0; y < e; ++y) num[static_cast<size_t>(y)] += in.at("y", row * e + y) * em;
            if (cfg.normalize) den += in.at("l", row) * em;
          }
          for (int64_t y = 0; y < e; ++y) {
            real v = num[static_cast<size_t>(y)];
            if (cfg.normalize) v = (den == 0.0) ? 0.0 : v / den;
            o.set(row * e + y, v);
          }
        }
      }
    out["o"] = std::move(o);
    return out;
  }

  tensor_map chunk_attention() const {
    tensor_map out;
    const int64_t c = cfg.c > 0 ? cfg.c : t;
    host_tensor Yt = host_tensor::zeros(EXPANSE_F64, {b, t, hq, e});
    host_tensor L = host_tensor::zeros(EXPANSE_F64, {b, t, hq});
    host_tensor M = host_tensor::zeros(EXPANSE_F64, {b, t, hq});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t qi = 0; qi < hq; ++qi) {
        const int64_t hi = qi / r;
        for (int64_t ti = 0; ti < t; ++ti) {
          const int64_t first = (ti / c) * c;
          const std::vector<real> qv = scaled(in.vec("q", qoff(bi, ti, qi), d), scale);
          std::vector<real> s, sgn;
          bool any = false;
          real rowmax = -INFINITY;
          for (int64_t j = first; j <= ti; ++j) {
            const real qk = dot(qv, in.vec("k", koff(bi, j, hi), d));
            real sc = -INFINITY, sg = 0;
            if (qk != 0.0) sc = p * std::log(std::fabs(qk)) + log_decay(bi, hi, j, ti);  // + Gc_i - Gc_j
            if (sc != -INFINITY) {  // a zero dot, or a reset in between: no term
              any = true;
              sg = (qk < 0 && p % 2 == 1) ? -1.0 : 1.0;
              rowmax = std::max(rowmax, sc);
            }
            s.push_back(sc);
            sgn.push_back(sg);
          }
          const int64_t row = (bi * t + ti) * hq + qi;
          if (!any) continue;  // y, l, rowmax stay 0
          std::vector<real> y(static_cast<size_t>(e), 0.0);
          real l = 0;
          for (int64_t j = first; j <= ti; ++j) {
            const size_t jj = static_cast<size_t>(j - first);
            if (sgn[jj] == 0) continue;
            const real w = sgn[jj] * std::exp(s[jj] - rowmax);
            l += w;
            for (int64_t x = 0; x < e; ++x) y[static_cast<size_t>(x)] += w * in.at("v", voff(bi, j, hi) + x);
          }
          for (int64_t x = 0; x < e; ++x) Yt.set(row * e + x, y[static_cast<size_t>(x)]);
          L.set(row, l);
          M.set(row, rowmax);
        }
      }
    out["y"] = std::move(Yt);
    out["l"] = std::move(L);
    out["rowmax"] = std::move(M);
    return out;
  }

  // power_attention and its decoding step (the state is given and returned as S, z; for one token
  // the step's tensors have no token axis: [b,hq,d] == [b,1,hq,d]).
  tensor_map attention(bool step) const {
    tensor_map out;
    auto sq = [&](int64_t bi, int64_t ti, int64_t hi) { return ((bi * t + ti) * hq + hi) * d; };
    auto sk = [&](int64_t bi, int64_t ti, int64_t hi) { return ((bi * t + ti) * h + hi) * d; };
    auto sv = [&](int64_t bi, int64_t ti, int64_t hi) { return ((bi * t + ti) * h + hi) * e; };
    const bool has_init = step || cfg.initial_state;
    const std::string Sname = step ? "S" : "initial_S", zname = step ? "z" : "initial_z";
    host_tensor o = step && t == 1 ? host_tensor::zeros(EXPANSE_F64, {b, hq, e})
                                   : host_tensor::zeros(EXPANSE_F64, {b, t, hq, e});
    host_tensor Sf = host_tensor::zeros(EXPANSE_F64, {b, h, D, e});
    host_tensor zf = host_tensor::zeros(EXPANSE_F64, {b, h, D});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        std::vector<real> S(static_cast<size_t>(D * e), 0.0), z(static_cast<size_t>(D), 0.0);
        if (has_init) {
          S = in.vec(Sname, (bi * h + hi) * D * e, D * e);
          if (cfg.normalize) z = in.vec(zname, (bi * h + hi) * D, D);
        }
        const std::vector<real> S0 = S, S0z = z;
        for (int64_t ti = 0; ti < t; ++ti) {
          const real g = gated ? std::exp(real(in.at("log_g", (bi * t + ti) * h + hi))) : real(1);
          advance(S, z, g, sk(bi, ti, hi), sv(bi, ti, hi));
          // o_t from the pairs (see causal_pair_sums), plus the decayed state before token 0.
          for (int64_t qi = hi * r; qi < (hi + 1) * r; ++qi) {
            const std::vector<real> qs = scaled(in.vec("q", sq(bi, ti, qi), d), scale);
            pair_sums ps = causal_pair_sums(bi, hi, ti, t, qs);
            if (has_init) {
              const std::vector<real> fq = phi_ext(qs, p, cfg.layout);
              const real w = ps.state_decay;
              for (int64_t x = 0; x < D; ++x) {
                if (cfg.normalize) ps.den += w * fq[static_cast<size_t>(x)] * S0z[static_cast<size_t>(x)];
                for (int64_t y = 0; y < e; ++y)
                  ps.num[static_cast<size_t>(y)] += w * fq[static_cast<size_t>(x)] * S0[static_cast<size_t>(x * e + y)];
              }
            }
            for (int64_t y = 0; y < e; ++y) {
              real v = ps.num[static_cast<size_t>(y)];
              if (cfg.normalize) v = (ps.den == 0.0) ? 0.0 : v / ps.den;
              o.set(((bi * t + ti) * hq + qi) * e + y, v);
            }
          }
        }
        for (int64_t x = 0; x < D * e; ++x) Sf.set((bi * h + hi) * D * e + x, S[static_cast<size_t>(x)]);
        for (int64_t x = 0; x < D; ++x) zf.set((bi * h + hi) * D + x, z[static_cast<size_t>(x)]);
      }
    out["o"] = std::move(o);
    if (step || cfg.final_state) {
      out[step ? "S" : "final_S"] = std::move(Sf);
      if (cfg.normalize) out[step ? "z" : "final_z"] = std::move(zf);
    }
    return out;
  }

  // power_attention_backward (docs/spec.md "Gradients") in reverse mode, token by token: the states
  // after every token are kept, then the state cotangents run backwards,
  //   dS <- dS + sum_heads phi(qs_i) dnum_i^T;  dq_i, dk_i, dv_i, dlog_g_i from dS, S;  dS <- g_i dS.
  tensor_map power_attention_backward() const {
    const bool has_init = cfg.initial_state && in.has("initial_S");
    const int64_t De = D * e;
    host_tensor dq = host_tensor::zeros(EXPANSE_F64, {b, t, hq, d}), dk = host_tensor::zeros(EXPANSE_F64, {b, t, h, d});
    host_tensor dv = host_tensor::zeros(EXPANSE_F64, {b, t, h, e}), dlog_g = host_tensor::zeros(EXPANSE_F64, {b, t, h});
    host_tensor dS0 = host_tensor::zeros(EXPANSE_F64, {b, h, D, e}), dz0 = host_tensor::zeros(EXPANSE_F64, {b, h, D});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        // states[i] (zs[i]): the state before token i; states[t] is the final one.
        std::vector<std::vector<real>> states(size_t(t + 1), std::vector<real>(size_t(De), 0.0));
        std::vector<std::vector<real>> zs(size_t(t + 1), std::vector<real>(size_t(D), 0.0));
        if (has_init) {
          states[0] = in.vec("initial_S", (bi * h + hi) * De, De);
          if (cfg.normalize) zs[0] = in.vec("initial_z", (bi * h + hi) * D, D);
        }
        for (int64_t ti = 0; ti < t; ++ti) {
          states[size_t(ti + 1)] = states[size_t(ti)];
          zs[size_t(ti + 1)] = zs[size_t(ti)];
          advance(states[size_t(ti + 1)], zs[size_t(ti + 1)], std::exp(logg(bi, ti, hi)), koff(bi, ti, hi), voff(bi, ti, hi));
        }
        std::vector<real> dS(size_t(De), 0.0), dz(size_t(D), 0.0);
        if (cfg.final_state) {
          dS = in.vec("dfinal_S", (bi * h + hi) * De, De);
          if (cfg.normalize) dz = in.vec("dfinal_z", (bi * h + hi) * D, D);
        }
        for (int64_t ti = t - 1; ti >= 0; --ti) {
          const std::vector<real>& Si = states[size_t(ti + 1)];
          const std::vector<real>& zi = zs[size_t(ti + 1)];
          const std::vector<real> kj = in.vec("k", koff(bi, ti, hi), d), vj = in.vec("v", voff(bi, ti, hi), e);
          const std::vector<real> fk = phi_ext(kj, p, cfg.layout);
          // Key ti's cotangents from the later queries (dS, dz hold the state's cotangent from them) ...
          std::vector<real> dfk(size_t(D), 0.0), dvj(size_t(e), 0.0);
          for (int64_t x = 0; x < D; ++x) {
            dfk[size_t(x)] = dz[size_t(x)];
            for (int64_t y = 0; y < e; ++y) {
              dfk[size_t(x)] += dS[size_t(x * e + y)] * vj[size_t(y)];
              dvj[size_t(y)] += dS[size_t(x * e + y)] * fk[size_t(x)];
            }
          }
          for (int64_t qi = hi * r; qi < (hi + 1) * r; ++qi) {
            const std::vector<real> qs = scaled(in.vec("q", qoff(bi, ti, qi), d), scale);
            const std::vector<real> fq = phi_ext(qs, p, cfg.layout);
            const int64_t row = (bi * t + ti) * hq + qi;
            std::vector<real> dnum = in.vec("dout", row * e, e);
            std::vector<real> o(size_t(e), 0.0);  // the output; stays 0 unless normalized
            real dden = 0;
            if (cfg.normalize) {
              o = in.vec("o", row * e, e);
              const pair_sums ps = causal_pair_sums(bi, hi, ti, t, qs);  // den as the forward sums it
              const real den = ps.den + (has_init ? ps.state_decay * dot(fq, zs[0]) : 0);
              if (den == 0.0) {
                dnum.assign(size_t(e), 0.0);
              } else {
                dden = -dot(dnum, o) / den;
                for (real& x : dnum) x /= den;
              }
            }
            // dfq = S_i dnum + z_i dden, with dden = -dnum . o, summed as (S_i - z_i o^T) dnum: exactly 0
            // where the state holds a single key, whose value o then equals whatever q is, instead of a
            // rounding residue of |S_i dnum| that a denominator near 0 makes large.
            std::vector<real> dfq(size_t(D), 0.0);
            for (int64_t x = 0; x < D; ++x) {
              for (int64_t y = 0; y < e; ++y) {
                dfq[size_t(x)] += (Si[size_t(x * e + y)] - zi[size_t(x)] * o[size_t(y)]) * dnum[size_t(y)];
                dS[size_t(x * e + y)] += fq[size_t(x)] * dnum[size_t(y)];
              }
              dz[size_t(x)] += fq[size_t(x)] * dden;
            }
            const std::vector<real> g = phi_pullback(qs, dfq, p, cfg.layout);
            for (int64_t x = 0; x < d; ++x) dq.set(row * d + x, scale * g[size_t(x)]);
            // ... and from query ti itself, taken apart for the same reason: dphi(k) gets
            // phi(q) dnum . (v - o), and dv gets phi(q) . phi(k) dnum with phi(q) . phi(k) = (q . k)^p
            // from the d-dimensional dot, not from D products that cancel where q . k is near 0.
            real own = 0;
            for (int64_t y = 0; y < e; ++y) own += dnum[size_t(y)] * (vj[size_t(y)] - o[size_t(y)]);
            for (int64_t x = 0; x < D; ++x) dfk[size_t(x)] += fq[size_t(x)] * own;
            const real kernel = std::pow(dot(qs, kj), p);
            for (int64_t y = 0; y < e; ++y) dvj[size_t(y)] += kernel * dnum[size_t(y)];
          }
          const std::vector<real> dkj = phi_pullback(kj, dfk, p, cfg.layout);
          for (int64_t x = 0; x < d; ++x) dk.set(koff(bi, ti, hi) + x, dkj[size_t(x)]);
          for (int64_t y = 0; y < e; ++y) dv.set(voff(bi, ti, hi) + y, dvj[size_t(y)]);
          // S_i = g_i S_{i-1} + ...: dlog_g_i = g_i <dS_i, S_{i-1}> (likewise z), and dS_{i-1} gets g_i dS_i.
          const real g = std::exp(logg(bi, ti, hi));
          dlog_g.set((bi * t + ti) * h + hi, g * (dot(dS, states[size_t(ti)]) + dot(dz, zs[size_t(ti)])));
          for (real& x : dS) x *= g;
          for (real& x : dz) x *= g;
        }
        for (int64_t x = 0; x < De; ++x) dS0.set((bi * h + hi) * De + x, dS[size_t(x)]);
        for (int64_t x = 0; x < D; ++x) dz0.set((bi * h + hi) * D + x, dz[size_t(x)]);
      }
    tensor_map out;
    out["dq"] = std::move(dq);
    out["dk"] = std::move(dk);
    out["dv"] = std::move(dv);
    if (gated) out["dlog_g"] = std::move(dlog_g);
    if (has_init) {
      out["dinitial_S"] = std::move(dS0);
      if (cfg.normalize) out["dinitial_z"] = std::move(dz0);
    }
    return out;
  }

  // update_state_backward: dS_m = sum_j w_j phi(k_j) v_j^T with w_j = exp(sum of log_g over (j, last]),
  // differentiated term by term.
  tensor_map update_state_backward() const {
    const int64_t c = cfg.c, n = chunk_count(t, c);
    host_tensor dk = host_tensor::zeros(EXPANSE_F64, {b, t, h, d}), dv = host_tensor::zeros(EXPANSE_F64, {b, t, h, e});
    host_tensor dlog_g = host_tensor::zeros(EXPANSE_F64, {b, t, h});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t m = 0; m < n; ++m) {
          const int64_t first = m * c, last = std::min(t, first + c) - 1, so = ((bi * n + m) * h + hi) * D;
          for (int64_t j = first; j <= last; ++j) {
            const real w = std::exp(log_decay(bi, hi, j, last));
            const std::vector<real> kj = in.vec("k", koff(bi, j, hi), d), vj = in.vec("v", voff(bi, j, hi), e);
            const std::vector<real> fk = phi_ext(kj, p, cfg.layout);
            std::vector<real> dfk(size_t(D), 0.0);
            real term = 0;  // <dS_m, phi(k_j) v_j^T> + <dz_m, phi(k_j)>
            for (int64_t x = 0; x < D; ++x) {
              if (in.has("dz")) dfk[size_t(x)] += in.at("dz", so + x);
              for (int64_t y = 0; y < e; ++y) {
                const real g = in.at("dS", (so + x) * e + y);
                dfk[size_t(x)] += g * vj[size_t(y)];
                dv.set(voff(bi, j, hi) + y, dv.get(voff(bi, j, hi) + y) + double(w * g * fk[size_t(x)]));
              }
              term += fk[size_t(x)] * dfk[size_t(x)];
            }
            const std::vector<real> g = phi_pullback(kj, scaled(dfk, w), p, cfg.layout);
            for (int64_t x = 0; x < d; ++x) dk.set(koff(bi, j, hi) + x, g[size_t(x)]);
            for (int64_t l = j + 1; l <= last; ++l)  // w_j holds log_g_l for j < l <= last
              if (std::isfinite(logg(bi, l, hi))) dlog_g.set((bi * t + l) * h + hi, dlog_g.get((bi * t + l) * h + hi) + double(w * term));
          }
        }
    tensor_map out;
    out["dk"] = std::move(dk);
    out["dv"] = std::move(dv);
    if (gated) out["dlog_g"] = std::move(dlog_g);
    return out;
  }

  // discumsum_backward from the closed form Y_m = P(0, m) Y_init + sum_{k < m} P(k + 1, m) X_k, with
  // P(a, m) = exp(A_a + ... + A_{m-1}): every derivative as an explicit sum over the later Y.
  tensor_map discumsum_backward() const {
    const int64_t c = cfg.c, n = chunk_count(t, c), inner = d * e;
    host_tensor dX = host_tensor::zeros(EXPANSE_F64, {b, n, h, d, e}), dA = host_tensor::zeros(EXPANSE_F64, {b, n, h});
    host_tensor dY0 = host_tensor::zeros(EXPANSE_F64, {b, h, d, e});
    const bool has_init = cfg.initial_state && in.has("Y_init");
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        auto A = [&](int64_t m) { return in.at("A", (bi * n + m) * h + hi); };
        auto P = [&](int64_t a, int64_t m) {  // the decay from after step a - 1 to Y_m
          real prod = 1;
          for (int64_t k = a; k < m; ++k) prod *= std::exp(A(k));
          return prod;
        };
        for (int64_t x = 0; x < inner; ++x) {
          auto X = [&](int64_t k) { return in.at("X", ((bi * n + k) * h + hi) * inner + x); };
          auto dY = [&](int64_t m) { return in.at("dY", ((bi * (n + 1) + m) * h + hi) * inner + x); };
          auto Y = [&](int64_t m) {
            real y = has_init ? P(0, m) * in.at("Y_init", (bi * h + hi) * inner + x) : 0;
            for (int64_t k = 0; k < m; ++k) y += P(k + 1, m) * X(k);
            return y;
          };
          for (int64_t k = 0; k < n; ++k) {  // dY_m/dX_k = P(k + 1, m) for m > k
            real g = 0;
            for (int64_t m = k + 1; m <= n; ++m) g += dY(m) * P(k + 1, m);
            dX.set(((bi * n + k) * h + hi) * inner + x, g);
            // dY_m/dA_k = exp(A_k) Y_k P(k + 1, m) for m > k (A_k enters every later Y through Y_{k+1})
            real ga = 0;
            if (std::isfinite(A(k)))
              for (int64_t m = k + 1; m <= n; ++m) ga += dY(m) * std::exp(A(k)) * Y(k) * P(k + 1, m);
            dA.set((bi * n + k) * h + hi, dA.get((bi * n + k) * h + hi) + double(ga));
          }
          real g0 = 0;
          for (int64_t m = 0; m <= n; ++m) g0 += dY(m) * P(0, m);
          dY0.set((bi * h + hi) * inner + x, g0);
        }
      }
    tensor_map out;
    out["dX"] = std::move(dX);
    out["dA"] = std::move(dA);
    if (has_init) out["dY_init"] = std::move(dY0);
    return out;
  }

  // query_state_backward, token by token: o_i from phi(scale q_i), the chunk's state and the intra
  // terms; rowmax is held fixed.
  tensor_map query_state_backward() const {
    const int64_t c = cfg.c > 0 ? cfg.c : t, n = chunk_count(t, c);
    host_tensor dq = host_tensor::zeros(EXPANSE_F64, {b, t, hq, d}), dS = host_tensor::zeros(EXPANSE_F64, {b, n, h, D, e});
    host_tensor dz = host_tensor::zeros(EXPANSE_F64, {b, n, h, D}), dlog_g = host_tensor::zeros(EXPANSE_F64, {b, t, h});
    host_tensor dy = host_tensor::zeros(EXPANSE_F64, {b, t, hq, e}), dl = host_tensor::zeros(EXPANSE_F64, {b, t, hq});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t qi = 0; qi < hq; ++qi) {
        const int64_t hi = qi / r;
        const std::vector<real> Gc = chunk_cumsum(bi, hi, c);
        for (int64_t ti = 0; ti < t; ++ti) {
          const int64_t m = ti / c, so = ((bi * n + m) * h + hi) * D, row = (bi * t + ti) * hq + qi;
          const real decay = std::exp(Gc[size_t(ti)]);
          const std::vector<real> qs = scaled(in.vec("q", qoff(bi, ti, qi), d), scale);
          const std::vector<real> fq = phi_ext(qs, p, cfg.layout);
          const real em = cfg.intra ? std::exp(in.at("rowmax", row)) : 0;
          std::vector<real> dnum = in.vec("dout", row * e, e);
          real dden = 0;
          if (cfg.normalize) {
            real den = cfg.intra ? in.at("l", row) * em : 0;
            for (int64_t x = 0; x < D; ++x) den += decay * fq[size_t(x)] * in.at("z", so + x);
            if (den == 0.0) {
              dnum.assign(size_t(e), 0.0);
            } else {
              dden = -dot(dnum, in.vec("o", row * e, e)) / den;
              for (real& v : dnum) v /= den;
            }
          }
          std::vector<real> dfq(size_t(D), 0.0);
          for (int64_t x = 0; x < D; ++x) {
            if (cfg.normalize) dfq[size_t(x)] += decay * in.at("z", so + x) * dden;
            for (int64_t y = 0; y < e; ++y) {
              dfq[size_t(x)] += decay * in.at("S", (so + x) * e + y) * dnum[size_t(y)];
              dS.set((so + x) * e + y, dS.get((so + x) * e + y) + double(decay * fq[size_t(x)] * dnum[size_t(y)]));
            }
            dz.set(so + x, dz.get(so + x) + double(decay * fq[size_t(x)] * dden));
          }
          const std::vector<real> g = phi_pullback(qs, dfq, p, cfg.layout);
          for (int64_t x = 0; x < d; ++x) dq.set(row * d + x, scale * g[size_t(x)]);
          for (int64_t y = 0; y < e; ++y) dy.set(row * e + y, em * dnum[size_t(y)]);
          dl.set(row, em * dden);
          // Gc_i holds log_g_l for the chunk's l <= i.
          const real term = dot(fq, dfq);
          for (int64_t l = m * c; l <= ti; ++l)
            if (std::isfinite(logg(bi, l, hi))) dlog_g.set((bi * t + l) * h + hi, dlog_g.get((bi * t + l) * h + hi) + double(term));
        }
      }
    tensor_map out;
    out["dq"] = std::move(dq);
    out["dS"] = std::move(dS);
    if (cfg.normalize) out["dz"] = std::move(dz);
    if (gated) out["dlog_g"] = std::move(dlog_g);
    if (cfg.intra) {
      out["dy"] = std::move(dy);
      out["dl"] = std::move(dl);
    }
    return out;
  }

  // chunk_attention_backward, pair by pair, with rowmax held fixed: y_i = exp(-rowmax_i) sum_j A_ij v_j
  // and l_i = exp(-rowmax_i) sum_j A_ij.
  tensor_map chunk_attention_backward() const {
    const int64_t c = cfg.c > 0 ? cfg.c : t;
    host_tensor dq = host_tensor::zeros(EXPANSE_F64, {b, t, hq, d}), dk = host_tensor::zeros(EXPANSE_F64, {b, t, h, d});
    host_tensor dv = host_tensor::zeros(EXPANSE_F64, {b, t, h, e}), dlog_g = host_tensor::zeros(EXPANSE_F64, {b, t, h});
    auto add = [](host_tensor& x, int64_t i, real v) { x.set(i, x.get(i) + double(v)); };
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t qi = 0; qi < hq; ++qi) {
        const int64_t hi = qi / r;
        for (int64_t ti = 0; ti < t; ++ti) {
          const int64_t row = (bi * t + ti) * hq + qi;
          const real unscale = std::exp(-in.at("rowmax", row));
          const std::vector<real> qs = scaled(in.vec("q", qoff(bi, ti, qi), d), scale);
          for (int64_t j = (ti / c) * c; j <= ti; ++j) {
            const std::vector<real> kj = in.vec("k", koff(bi, j, hi), d), vj = in.vec("v", voff(bi, j, hi), e);
            const real decay = std::exp(log_decay(bi, hi, j, ti)), qk = dot(qs, kj);
            if (decay == 0.0) continue;
            real dA = 0;  // d L / d A_ij
            for (int64_t y = 0; y < e; ++y) dA += unscale * in.at("dy", row * e + y) * vj[size_t(y)];
            if (in.has("dl")) dA += unscale * in.at("dl", row);
            real pw = 1;
            for (int i = 0; i < p - 1; ++i) pw *= qk;
            const real A = pw * qk * decay, dqk = dA * p * pw * decay;  // d L / d (scale q_i . k_j)
            for (int64_t x = 0; x < d; ++x) {
              add(dq, row * d + x, dqk * scale * kj[size_t(x)]);
              add(dk, koff(bi, j, hi) + x, dqk * qs[size_t(x)]);
            }
            for (int64_t y = 0; y < e; ++y) add(dv, voff(bi, j, hi) + y, A * unscale * in.at("dy", row * e + y));
            for (int64_t l = j + 1; l <= ti; ++l)  // the decay holds log_g_l for j < l <= i
              if (std::isfinite(logg(bi, l, hi))) add(dlog_g, (bi * t + l) * h + hi, dA * A);
          }
        }
      }
    tensor_map out;
    out["dq"] = std::move(dq);
    out["dk"] = std::move(dk);
    out["dv"] = std::move(dv);
    if (gated) out["dlog_g"] = std::move(dlog_g);
    return out;
  }

  // sequence_state: the recurrence S_i = g_i S_{i-1} + phi(k_i) v_i^T from zero, token by token, and
  // A = the sum of log_g (-inf where a reset occurs).
  tensor_map sequence_state() const {
    host_tensor S = host_tensor::zeros(EXPANSE_F64, {b, h, D, e}), z = host_tensor::zeros(EXPANSE_F64, {b, h, D});
    host_tensor A = host_tensor::zeros(EXPANSE_F64, {b, h});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        std::vector<real> s(static_cast<size_t>(D * e), 0.0), zz(static_cast<size_t>(D), 0.0);
        real total = 0;
        for (int64_t ti = 0; ti < t; ++ti) {
          total += logg(bi, ti, hi);
          advance(s, zz, std::exp(logg(bi, ti, hi)), koff(bi, ti, hi), voff(bi, ti, hi));
        }
        for (int64_t x = 0; x < D * e; ++x) S.set((bi * h + hi) * D * e + x, double(s[size_t(x)]));
        for (int64_t x = 0; x < D; ++x) z.set((bi * h + hi) * D + x, double(zz[size_t(x)]));
        A.set(bi * h + hi, double(total));
      }
    return {{"S", std::move(S)}, {"z", std::move(z)}, {"A", std::move(A)}};
  }

  tensor_map power_attention() const { return attention(false); }
  tensor_map power_attention_step() const { return attention(true); }
};

}  // namespace

tensor_map run(const op_config& cfg, const tensor_map& inputs) {
  using runner = tensor_map (problem::*)() const;
#define EXPANSE_NAIVE_ENTRY(name, NAME) &problem::name,
  static const runner runners[EXPANSE_OP_COUNT] = {EXPANSE_OPERATIONS(EXPANSE_NAIVE_ENTRY)};
#undef EXPANSE_NAIVE_ENTRY
  if (cfg.op < 0 || cfg.op >= EXPANSE_OP_COUNT)
    throw std::invalid_argument("naive oracle: unknown op " + std::to_string(static_cast<int>(cfg.op)));
  const problem pr(cfg, inputs);
  return (pr.*runners[cfg.op])();
}

}  // namespace expanse::harness::naive
