// The feature-map table: for every row r of phi its coefficient and the p indices of x it
// multiplies, in the layout asked for (docs/spec.md "The feature map phi"). Each thread unranks one row
// directly, so the table builds in one short kernel for any D.
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

// C(n, k) for k <= kMaxDegree; every partial product is an integer. The loop is unrolled so that
// each division is by a constant (a multiply and shifts): with a 64-bit division routine per step the
// table took 18 us at P1 (D = 2080), which the decoding step paid on every call.
__device__ int64_t binomial(int64_t n, int k) {
  int64_t r = 1;
#pragma unroll
  for (int i = 1; i <= kMaxDegree; ++i)
    if (i <= k) r = r * (n - k + i) / i;
  return r;
}

// The sequences of length left + 1 over [lo, n) whose first value is below v (non-decreasing): the
// sum over u in [lo, v) of C(n - u + left - 1, left), which telescopes (hockey stick).
__device__ int64_t sequences_below(int64_t v, int64_t lo, int left, int64_t n) {
  return binomial(n - lo + left, left + 1) - binomial(n - v + left, left + 1);
}

// The r-th non-decreasing multi-index of length p with values in [0, n), lexicographic order: each
// value by bisection over sequences_below (a scan over the values, one binomial each, had made the
// table the decoding step's slowest kernel).
__device__ void unrank_nondecreasing(int64_t r, int p, int64_t n, int64_t* out) {
  int64_t lo = 0;
  for (int k = 0; k < p; ++k) {
    const int left = p - k - 1;  // positions after this one
    int64_t a = lo, b = n - 1;   // the largest v with sequences_below(v) <= r
    while (a < b) {
      const int64_t mid = (a + b + 1) / 2;
      if (sequences_below(mid, lo, left, n) <= r) a = mid;
      else b = mid - 1;
    }
    r -= sequences_below(a, lo, left, n);
    out[k] = a;
    lo = a;
  }
}

// sqrt(p! / prod hist!) of a sorted multi-index.
__device__ float multinomial_sqrt(const int64_t* idx, int p) {
  double num = 1, den = 1;
  for (int i = 2; i <= p; ++i) num *= i;
  int run = 1;
  for (int f = 1; f <= p; ++f) {
    if (f < p && idx[f] == idx[f - 1]) {
      ++run;
    } else {
      for (int i = 2; i <= run; ++i) den *= i;
      run = 1;
    }
  }
  return static_cast<float>(sqrt(num / den));
}

__global__ void build_phi_table(phi_entry* table, int64_t D, int p, int64_t d, int kind, int64_t d_tile) {
  EXPANSE_GRID_LOOP(r, D) {
    int64_t idx[kMaxDegree] = {0, 0, 0, 0, 0, 0};
    float coef = 1.f;
    if (kind == EXPANSE_LAYOUT_SYMPOW) {
      unrank_nondecreasing(r, p, d, idx);
      coef = multinomial_sqrt(idx, p);
    } else if (kind == EXPANSE_LAYOUT_TILED) {
      int64_t block_size = 1;
      for (int k = 0; k < p; ++k) block_size *= d_tile;
      int64_t tiles[kMaxDegree] = {0, 0, 0, 0, 0, 0};
      unrank_nondecreasing(r / block_size, p, d / d_tile, tiles);
      coef = multinomial_sqrt(tiles, p);
      int64_t local = r % block_size;  // row-major over the local indices, the last fastest
      for (int k = p - 1; k >= 0; --k) {
        idx[k] = tiles[k] * d_tile + local % d_tile;
        local /= d_tile;
      }
    } else {  // tensor: all d^p products, row-major
      int64_t rest = r;
      for (int k = p - 1; k >= 0; --k) {
        idx[k] = rest % d;
        rest /= d;
      }
    }
    phi_entry e;
    e.coef = coef;
    for (int k = 0; k < kMaxDegree; ++k) e.idx[k] = static_cast<uint16_t>(idx[k]);
    table[r] = e;
  }
}

// Rank of a non-decreasing multi-index among those of its length in lexicographic order.
__device__ int64_t rank_nondecreasing(const int64_t* idx, int p, int64_t n) {
  int64_t r = 0, lo = 0;
  for (int k = 0; k < p; ++k) {
    r += sequences_below(idx[k], lo, p - k - 1, n);
    lo = idx[k];
  }
  return r;
}

// One thread per row of the tiled:8 expansion (kernels/common.cuh, phi_block): its row in the
// problem's layout and coefficient, and for the first row of each block of 64 the block's factors.
__global__ void build_phi_blocks(phi_block* blocks, phi_block_row* rows, int64_t rows_count, int p, int64_t d,
                                 int kind) {
  EXPANSE_GRID_LOOP(v, rows_count) {
    int64_t block_size = 1;
    for (int k = 0; k < p; ++k) block_size *= 8;
    int64_t tiles[kMaxDegree] = {0, 0, 0, 0, 0, 0}, idx[kMaxDegree] = {0, 0, 0, 0, 0, 0};
    unrank_nondecreasing(v / block_size, p, d / 8, tiles);
    int64_t local = v % block_size;
    for (int k = p - 1; k >= 0; --k) {
      idx[k] = tiles[k] * 8 + local % 8;
      local /= 8;
    }
    phi_block_row out{int32_t(v), multinomial_sqrt(tiles, p)};
    if (kind == EXPANSE_LAYOUT_SYMPOW) {
      bool sorted = true;
      for (int k = 1; k < p; ++k) sorted = sorted && idx[k - 1] <= idx[k];
      out = sorted ? phi_block_row{int32_t(rank_nondecreasing(idx, p, d)), multinomial_sqrt(idx, p)}
                   : phi_block_row{-1, 0.f};
    }
    rows[v] = out;
    if (v % 64 == 0) {
      phi_block b;
      for (int k = 0; k < 2; ++k) b.fixed[k] = static_cast<uint16_t>(k < p - 2 ? idx[k] : d);
      b.mid = static_cast<uint16_t>(idx[p - 2]);
      b.last = static_cast<uint16_t>(idx[p - 1]);
      blocks[v / 64] = b;
    }
  }
}

}  // namespace expanse_gpu
