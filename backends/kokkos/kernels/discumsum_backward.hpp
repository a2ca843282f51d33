// discumsum_backward (docs/spec.md "Gradients"): with G the cotangent of Y,
//   G_n = dY_n,  G_m = dY_m + exp(A_m) G_{m+1};  dX_m = G_{m+1},  dA_m = exp(A_m) <G_{m+1}, Y_m>,
//   dY_init = G_0.
// A team per (batch, head) walks the chunks forwards (Y_m into the workspace), then backwards, its
// threads over the state's entries; dA_m is a team reduction.
#pragma once

#include "kokkos/kernels/discumsum.hpp"

namespace expanse_kokkos {

template <class Space>
void launch_discumsum_backward(const Space& space, state_ref X, tensor_ref A, state_ref init, state_ref dY, state_ref dX,
                               tensor_ref dA, state_ref dinit, int64_t b, int64_t n, int64_t h, int64_t elems,
                               float* Y_work, float* G_work) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "expanse::discumsum_backward", policy(space, b * h, Kokkos::AUTO), KOKKOS_LAMBDA(const member& team) {
        const int64_t head = team.league_rank() % h, batch = team.league_rank() / h;
        float* G = G_work + team.league_rank() * elems;
        float* Y = Y_work + team.league_rank() * n * elems;
        auto decay = [&](int64_t m) { return A.present() ? math::exp(A.get(A.at(batch, m, head))) : 1.f; };
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, elems), [&](int64_t i) {
          G[i] = init.t.present() ? init.t.get(init.offset(batch, 0, head, i)) : 0.f;
        });
        for (int64_t m = 0; m < n; ++m) {
          team.team_barrier();
          const float a = decay(m);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, elems), [&](int64_t i) {
            Y[m * elems + i] = G[i];
            G[i] = a * G[i] + X.t.get(X.offset(batch, m, head, i));
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, elems), [&](int64_t i) {
          G[i] = dY.t.get(dY.offset(batch, n, head, i));
        });
        for (int64_t m = n - 1; m >= 0; --m) {
          team.team_barrier();
          const float a = decay(m);
          float dot = 0.f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, elems),
              [&](int64_t i, float& acc) {
                dX.t.set(dX.offset(batch, m, head, i), G[i]);
                acc += G[i] * Y[m * elems + i];
                G[i] = dY.t.get(dY.offset(batch, m, head, i)) + a * G[i];
              },
              dot);
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            if (dA.present()) dA.set(dA.at(batch, m, head), a * dot);
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, elems), [&](int64_t i) {
          if (dinit.t.present()) dinit.t.set(dinit.offset(batch, 0, head, i), G[i]);
        });
      });
}

}  // namespace expanse_kokkos
