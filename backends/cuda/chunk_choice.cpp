// power_attention's form and chunk size for EXPANSE_CHUNK_AUTO on this backend (the optional extra
// "expanse_choose_chunk_size" of backend.h), from a cost model calibrated on the H100
// (docs/performance.md, "The automatic chunk size"). Per query head and token:
//   quadratic:  t (d + e) / 2 multiply-adds in the flash kernel (the causal half of QK^T and PV);
//   chunked:    c (d + e) / 2 in the same kernel, plus the state products D e (1 + 1/r) (update_state
//               per kv head, query_state per query head, r = hq / h) in the state kernels, plus
//               D e / c of state memory written, scanned and read (n = t / c states of D x e).
// The flash kernel runs about kFlashOverState times slower per multiply-add than the state kernels
// (measured, with the chunked form's fixed costs folded in), so the quadratic form wins while
//   t < c + 2 D e (1 + 1/r) kFlashOverState / (d + e).
// The chunk size balances the first and last chunked terms: c ~ sqrt(D e / (d + e)), scaled to the
// best measured at P1 (1024, where D e / (d + e) = 1040) and rounded to a power of two.
#include <cmath>

#include "dispatch.hpp"

namespace expanse_cuda {

namespace {
constexpr double kFlashOverState = 0.8;
constexpr double kP1Balance = 2080.0 * 64 / (64 + 64);  // D e / (d + e) at P1
constexpr double kP1Chunk = 1024;

int64_t chunk_for(const expanse_problem& pb) {
  const double balance = double(pb.D) * double(pb.e) / double(pb.d + pb.e);
  const double ideal = kP1Chunk * std::sqrt(balance / kP1Balance);
  const double rounded = std::exp2(std::round(std::log2(ideal)));
  return static_cast<int64_t>(std::fmin(4096.0, std::fmax(256.0, rounded)));
}
}  // namespace

int64_t choose_chunk_size(const expanse_problem* pb) {
  const int64_t c = chunk_for(*pb);
  const double r = pb->h > 0 ? double(pb->hq) / double(pb->h) : 1.0;
  const double state = double(pb->D) * double(pb->e) * (1.0 + 1.0 / r);
  const double crossover = double(c) + 2.0 * state * kFlashOverState / double(pb->d + pb->e);
  return double(pb->t) < crossover ? 0 : c;
}

}  // namespace expanse_cuda
