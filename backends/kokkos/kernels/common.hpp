// What every Kokkos kernel of expanse shares (KOKKOS_INLINE_FUNCTION: host and device): a tensor
// read and written through its strides in any input dtype (f32, f16, bf16; the 16-bit codecs round
// to nearest even), the rows of the phi table, and the gate sums of each chunk.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

#include "expanse/backend.h"

namespace expanse_kokkos {

// The math functions of the Kokkos version at hand (Kokkos 4 moved them out of Experimental).
#if KOKKOS_VERSION >= 40000
namespace math = Kokkos;
#else
namespace math = Kokkos::Experimental;
#endif

constexpr int kMaxDegree = 6;  // the largest p of the phi table's rows
constexpr int kMaxDims = EXPANSE_MAX_DIMS;

KOKKOS_INLINE_FUNCTION float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
KOKKOS_INLINE_FUNCTION uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
KOKKOS_INLINE_FUNCTION float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
KOKKOS_INLINE_FUNCTION uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN stays NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
KOKKOS_INLINE_FUNCTION float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = float(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}
KOKKOS_INLINE_FUNCTION uint16_t f32_to_f16(float f) {
  uint32_t x = f32_to_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return uint16_t(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  uint32_t shift, mant;
  if (x < 0x38800000u) {  // below 2^-14: a subnormal result, round(|f| * 2^24)
    shift = 126u - (x >> 23);
    if (shift > 24u) return sign;
    mant = (x & 0x7fffffu) | 0x800000u;
  } else {  // rebias the exponent (127 -> 15) and drop 13 bits
    shift = 13u;
    mant = x - 0x38000000u;
  }
  uint32_t r = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (r & 1u))) ++r;  // may carry into the exponent: still right
  return uint16_t(sign | r);
}

// A tensor's data, dtype and strides (in elements), copied into kernels by value.
struct tensor_ref {
  void* data = nullptr;
  int32_t dtype = EXPANSE_F32;
  int32_t ndim = 0;
  int64_t stride[kMaxDims] = {};

  tensor_ref() = default;
  explicit tensor_ref(const expanse_tensor* t) {
    if (t == nullptr) return;
    data = t->data;
    dtype = t->dtype;
    ndim = t->ndim;
    for (int i = 0; i < kMaxDims; ++i) stride[i] = i < t->ndim ? t->strides[i] : 0;
  }
  KOKKOS_INLINE_FUNCTION bool present() const { return data != nullptr; }
  KOKKOS_INLINE_FUNCTION float get(int64_t off) const {
    switch (dtype) {
      case EXPANSE_F16: return f16_to_f32(static_cast<const uint16_t*>(data)[off]);
      case EXPANSE_BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[off]);
      default: return static_cast<const float*>(data)[off];
    }
  }
  KOKKOS_INLINE_FUNCTION void set(int64_t off, float v) const {
    switch (dtype) {
      case EXPANSE_F16: static_cast<uint16_t*>(data)[off] = f32_to_f16(v); break;
      case EXPANSE_BF16: static_cast<uint16_t*>(data)[off] = f32_to_bf16(v); break;
      default: static_cast<float*>(data)[off] = v;
    }
  }
  // Offsets of rank-3, -4 and -5 indices.
  KOKKOS_INLINE_FUNCTION int64_t at(int64_t i0, int64_t i1, int64_t i2) const {
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
  }
  KOKKOS_INLINE_FUNCTION int64_t at(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
    return at(i0, i1, i2) + i3 * stride[3];
  }
  KOKKOS_INLINE_FUNCTION int64_t at(int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) const {
    return at(i0, i1, i2, i3) + i4 * stride[4];
  }
};

// One entry of phi: coef * x[idx[0]] * ... * x[idx[p-1]] (docs/spec.md, every layout). coef (a square
// root of a multinomial count) in f64 for the sums that must be exact to f32 (query_gradients.hpp).
struct phi_row {
  int32_t idx[kMaxDegree];
  double coef;
};

// phi_row(x) in G's precision.
template <class G, class X>
KOKKOS_INLINE_FUNCTION G phi_entry(const phi_row& row, int p, const X* x) {
  G v = G(row.coef);
  for (int k = 0; k < p; ++k) v *= G(x[row.idx[k]]);
  return v;
}

// grad += w J_phi(x)^T e_row: the gradient of w phi_row(x) with respect to x (phi_row a product of p
// entries of x), in grad's precision.
template <class G>
KOKKOS_INLINE_FUNCTION void add_phi_pullback(const phi_row& row, int p, const float* x, float w, G* grad) {
  for (int k = 0; k < p; ++k) {
    G partial = G(w) * G(row.coef);
    for (int other = 0; other < p; ++other)
      if (other != k) partial *= G(x[row.idx[other]]);
    grad[row.idx[k]] += partial;
  }
}

// scale q . k of unscaled q [d] and k [d], summed in f64 and scaled after: a nearly orthogonal q and
// k (a query whose only key is its own, after a reset or at a chunk's start) make the sum cancel, and
// the pair then dominates its row (its log is the row maximum; its tiny denominator makes its
// gradients the largest), so f32 sums of a rounded scale q missed the f32 tolerance (rowmax 1.3e-5,
// dq 1.1e-5; 1e-5 is the tolerance).
// The products are exact in f64; four independent sums, as one chain of f64 adds (4 cycles each, not
// vectorized without reassociation) made this dot a third of chunk_attention on the host.
KOKKOS_INLINE_FUNCTION double scaled_dot(const float* q, const float* k, int64_t d, double scale) {
  double part[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t a = 0;
  for (; a + 4 <= d; a += 4)
    for (int u = 0; u < 4; ++u) part[u] += double(q[a + u]) * k[a + u];
  for (; a < d; ++a) part[0] += double(q[a]) * k[a];
  return scale * ((part[0] + part[1]) + (part[2] + part[3]));
}

// The gates of each chunk, per [b,h] row of tokens (made once per call, ops/common.cpp). The decays
// are evaluated as docs/spec.md asks, never as -inf - (-inf): within a chunk, `since` is the sum of
// log_g from the chunk's start, restarted at each reset (0 at the reset token), and `reset` the
// chunk-local index of the last reset at or before the token (-1: none). Absent gates: empty.
struct gate_sums {
  const double* since = nullptr;  // [b,h,t], f64: a decay is the difference of two sums, exact to f32 then
  const int32_t* reset = nullptr;
  int64_t t = 0, c = 1;

  KOKKOS_INLINE_FUNCTION bool present() const { return since != nullptr; }
  // The first key of token i's chunk that reaches i (chunk-local index).
  KOKKOS_INLINE_FUNCTION int64_t first_key(int64_t bh, int64_t i) const {
    const int32_t r = present() ? reset[bh * t + i] : -1;
    return r < 0 ? 0 : r;
  }
  // log of the decay from key j to token i of the same chunk (j >= first_key(i)).
  KOKKOS_INLINE_FUNCTION float log_decay(int64_t bh, int64_t j, int64_t i) const {
    return present() ? float(since[bh * t + i] - since[bh * t + j]) : 0.f;
  }
  // log of the decay from the state entering i's chunk to token i: Gc_i, -inf after a reset.
  KOKKOS_INLINE_FUNCTION float log_from_chunk_start(int64_t bh, int64_t i) const {
    if (!present()) return 0.f;
    return reset[bh * t + i] >= 0 ? -INFINITY : float(since[bh * t + i]);
  }
};

// Whether an execution space runs on the host (its loops are a CPU's: division per element is
// costly, vector units want contiguous inner loops) or on a GPU (every thread wants work), and
// whether a team of this member type does.
template <class Space>
constexpr bool kHostSpace = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
template <class Member>
constexpr bool kOnHost = kHostSpace<typename Member::execution_space>;

// Calls f(row, col) for row < rows and col < cols, shared among the team's threads: on a GPU one flat
// range over the pairs, on the host rows across the threads and a plain loop over the columns (there a
// division per element cost as much as a tile product's multiply-adds: 19% of update_state at P1).
template <class Member, class F>
KOKKOS_INLINE_FUNCTION void team_for_2d(const Member& team, int64_t rows, int64_t cols, const F& f) {
  if constexpr (kOnHost<Member>) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int64_t row) {
      for (int64_t col = 0; col < cols; ++col) f(row, col);
    });
  } else {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * cols), [&](int64_t i) { f(i / cols, i % cols); });
  }
}

// acc [rows][cols] += a [rows][inner] (row stride lda) times b [inner][cols] (row stride cols): a tile
// product in scratch, shared among the team's threads by pieces of kColumns columns of one row, whose
// sums each thread keeps in registers over the inner loop. On the host the compiler vectorizes the
// piece: 16 columns are four independent SSE sums, 1.5x the speed of 8 (two, each waiting on its
// previous add); GCC turned pieces of several rows into shuffles, 2-3x slower.
template <class Member>
KOKKOS_INLINE_FUNCTION void team_add_product(const Member& team, float* acc, const float* a, int64_t lda, const float* b,
                                             int64_t rows, int64_t inner, int64_t cols) {
  constexpr int kColumns = 16;
  const int64_t pieces = (cols + kColumns - 1) / kColumns;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * pieces), [&](int64_t i) {
    const int64_t row = i / pieces, c0 = (i % pieces) * kColumns;
    float* out = acc + row * cols + c0;
    const float* ar = a + row * lda;
    if (c0 + kColumns <= cols) {
      float sum[kColumns];
      for (int c = 0; c < kColumns; ++c) sum[c] = out[c];
      for (int64_t k = 0; k < inner; ++k) {
        const float x = ar[k];
        const float* in = b + k * cols + c0;
        for (int c = 0; c < kColumns; ++c) sum[c] += x * in[c];
      }
      for (int c = 0; c < kColumns; ++c) out[c] = sum[c];
    } else {
      for (int64_t col = 0; col < cols - c0; ++col) {  // few columns (a narrow e, or z's): summed in f64
        double sum = out[col];
        for (int64_t k = 0; k < inner; ++k) sum += double(ar[k]) * b[k * cols + c0 + col];
        out[col] = float(sum);
      }
    }
  });
}

// ph[r * r_stride + j * j_stride] = phi_{r0 + r}(x_j) for rows r < rows and the tokens x [tokens][d]
// in scratch: a tile of phi, never more of it. The degree is a template argument inside, so that each
// entry's product is unrolled (with p read in the loop, it took a sixth of update_state on the host).
// kExact: scale_p phi(x_j), each entry formed in f64 (the coefficient and scale_p exact) and rounded
// once, for query_state, whose products with a state cancel where the state's entries have both
// signs: four f32 roundings per entry left its o 2e-5 off on a p = 4 case of the table (tolerance
// 1e-5). Not in update_state: 2% of the README demo's forward for no measured gain.
template <int P, bool kExact, class Member>
KOKKOS_INLINE_FUNCTION void team_phi_tile_of_degree(const Member& team, float* ph, int64_t r_stride, int64_t j_stride,
                                                    const phi_row* table, int64_t r0, int64_t rows, const float* x,
                                                    int64_t tokens, int64_t d, double scale_p) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int64_t r) {
    const phi_row row = table[r0 + r];
    for (int64_t j = 0; j < tokens; ++j) {
      const float* xj = x + j * d;
      ph[r * r_stride + j * j_stride] = kExact ? float(scale_p * phi_entry<double>(row, P, xj)) : phi_entry<float>(row, P, xj);
    }
  });
}
template <bool kExact, class Member>
KOKKOS_INLINE_FUNCTION void team_phi_tile_of(const Member& team, float* ph, int64_t r_stride, int64_t j_stride,
                                             const phi_row* table, int64_t r0, int64_t rows, int p, const float* x,
                                             int64_t tokens, int64_t d, double scale_p) {
  static_assert(kMaxDegree == 6, "team_phi_tile names each degree");
  switch (p) {
    case 1: return team_phi_tile_of_degree<1, kExact>(team, ph, r_stride, j_stride, table, r0, rows, x, tokens, d, scale_p);
    case 2: return team_phi_tile_of_degree<2, kExact>(team, ph, r_stride, j_stride, table, r0, rows, x, tokens, d, scale_p);
    case 3: return team_phi_tile_of_degree<3, kExact>(team, ph, r_stride, j_stride, table, r0, rows, x, tokens, d, scale_p);
    case 4: return team_phi_tile_of_degree<4, kExact>(team, ph, r_stride, j_stride, table, r0, rows, x, tokens, d, scale_p);
    case 5: return team_phi_tile_of_degree<5, kExact>(team, ph, r_stride, j_stride, table, r0, rows, x, tokens, d, scale_p);
    default: return team_phi_tile_of_degree<6, kExact>(team, ph, r_stride, j_stride, table, r0, rows, x, tokens, d, scale_p);
  }
}
template <class Member>
KOKKOS_INLINE_FUNCTION void team_phi_tile(const Member& team, float* ph, int64_t r_stride, int64_t j_stride,
                                          const phi_row* table, int64_t r0, int64_t rows, int p, const float* x,
                                          int64_t tokens, int64_t d) {
  team_phi_tile_of<false>(team, ph, r_stride, j_stride, table, r0, rows, p, x, tokens, d, 1.0);
}
template <class Member>
KOKKOS_INLINE_FUNCTION void team_phi_tile_exact(const Member& team, float* ph, int64_t r_stride, int64_t j_stride,
                                                const phi_row* table, int64_t r0, int64_t rows, int p, const float* x,
                                                int64_t tokens, int64_t d, double scale_p) {
  team_phi_tile_of<true>(team, ph, r_stride, j_stride, table, r0, rows, p, x, tokens, d, scale_p);
}

// Stages rows tok0 .. tok0 + count - 1 of one head of a token tensor [b,t,heads,width] into scratch
// [count][width], times `scale`.
template <class Member>
KOKKOS_INLINE_FUNCTION void team_load_rows(const Member& team, float* dst, const tensor_ref& x, int64_t batch,
                                           int64_t tok0, int64_t head, int64_t count, int64_t width, float scale = 1.f) {
  team_for_2d(team, count, width, [&](int64_t row, int64_t col) {
    dst[row * width + col] = scale * x.get(x.at(batch, tok0 + row, head, col));
  });
}

// Gives each team of `policy` `bytes` of scratch: level 0 (a GPU's shared memory) where it fits, level
// 1 (device memory) otherwise; returns the level, which the kernel's team_floats takes.
template <class Policy>
int set_team_scratch(Policy& policy, size_t bytes) {
  const int level = bytes <= size_t(Policy::scratch_size_max(0)) ? 0 : 1;
  policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
  return level;
}
template <class Member>
KOKKOS_INLINE_FUNCTION float* team_floats(const Member& team, int level, size_t bytes) {
  return static_cast<float*>(team.team_scratch(level).get_shmem(bytes));
}

// dst[0 .. count) = 0, shared among the team's threads.
template <class Member, class T>
KOKKOS_INLINE_FUNCTION void team_zero(const Member& team, T* dst, int64_t count) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int64_t i) { dst[i] = T(0); });
}

// The tokens of one team: the league rank runs over (batch, head, chunk, block of `per_team` tokens of
// the chunk), fastest last, over `heads` heads (the query heads or the kv heads).
struct token_block {
  int64_t batch, head, m, first, len, start, count;  // first, len: the chunk; start, count: the block in it
  KOKKOS_INLINE_FUNCTION token_block(int64_t rank, int64_t per_team, int64_t heads, const expanse_problem& pb) {
    const int64_t blocks = (pb.c + per_team - 1) / per_team;
    const int64_t blk = rank % blocks;
    rank /= blocks;
    m = rank % pb.n;
    rank /= pb.n;
    head = rank % heads;
    batch = rank / heads;
    first = m * pb.c;
    len = first + pb.c < pb.t ? pb.c : pb.t - first;
    start = blk * per_team;
    count = start >= len ? 0 : start + per_team < len ? per_team : len - start;
  }
  static int64_t teams(int64_t per_team, int64_t heads, const expanse_problem& pb) {
    return pb.b * heads * pb.n * ((pb.c + per_team - 1) / per_team);
  }
};

// The queries of one team of the query kernels (query_state, chunk_attention, the backward's).
struct query_block : token_block {
  int64_t qh, kv, bh, i0;
  KOKKOS_INLINE_FUNCTION query_block(int64_t rank, int64_t per_team, const expanse_problem& pb)
      : token_block(rank, per_team, pb.hq, pb), qh(head), kv(head / (pb.hq / pb.h)), bh(batch * pb.h + kv), i0(start) {}
  static int64_t teams(int64_t per_team, const expanse_problem& pb) { return token_block::teams(per_team, pb.hq, pb); }
};

// The keys of one team of the backward's key kernels.
struct key_block : token_block {
  int64_t kv, bh, j0;
  KOKKOS_INLINE_FUNCTION key_block(int64_t rank, int64_t per_team, const expanse_problem& pb)
      : token_block(rank, per_team, pb.h, pb), kv(head), bh(batch * pb.h + kv), j0(start) {}
  static int64_t teams(int64_t per_team, const expanse_problem& pb) { return token_block::teams(per_team, pb.h, pb); }
};

}  // namespace expanse_kokkos
