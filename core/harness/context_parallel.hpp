// Context parallelism on simulated ranks (docs/spec.md "Context parallelism"): one sequence split
// into pieces, each piece run as a rank would run it, the states the ranks would exchange passed
// through host memory instead of a communicator. What the ranks compute is only the library's
// public operations (sequence_state, power_attention, power_attention_backward, discumsum,
// discumsum_backward), so
// these recipes are the ones a framework's collective layer follows; the tests check that they give
// the single-sequence results on every backend.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cases.hpp"

namespace expanse::harness {

// power_attention of `whole` (a power_attention config: its t, b, heads, sizes, options) computed
// piece by piece: `bounds` are the piece boundaries 0 = t_0 < t_1 < ... < t_R = t. Each rank gets
// its piece's final state from zero and its total log decay (sequence_state), the states entering the pieces come
// from discumsum over the ranks (with the sequence's initial state in front), and each rank reruns
// its piece from its entering state. Returns o (and final_S, final_z where whole.final_state) in
// the dtypes of run_on(ctx, whole, inputs, oracle).
tensor_map context_parallel_forward(expanse::context& ctx, const op_config& whole, const tensor_map& inputs,
                                    const std::vector<int64_t>& bounds, bool oracle);

// power_attention_backward of `whole` (a power_attention_backward config) piece by piece: each rank's
// backward from its entering state gives its token gradients and the cotangent of that state;
// discumsum_backward over the ranks turns those (and dfinal) into the cotangents of the pieces' own
// final states and total decays, which each rank then takes back to its k, v and log_g. Returns dq,
// dk, dv (dlog_g, dinitial_S, dinitial_z as the config has them).
tensor_map context_parallel_backward(expanse::context& ctx, const op_config& whole, const tensor_map& inputs,
                                     const std::vector<int64_t>& bounds, bool oracle);

// What a rank of context_parallel_threads runs on: its device and its all-gather (with its user
// pointer, e.g. NCCL's with the rank's communicator).
struct rank_collective {
  int32_t device;
  expanse_allgather_fn allgather;
  void* user;
};

// Rank `rank` of power_attention (or its backward, as `whole`'s op is) through the C API
// (expanse_context_parallel_power_attention and its backward) on a context of `backend` on
// mine.device, exchanging through mine.allgather: its piece's outputs (o or dq, dk, dv, dlog_g over
// its tokens; the final state; dinitial_* where rank 0). Every rank of `bounds` must run it at once.
tensor_map context_parallel_rank(const std::string& backend, const op_config& whole, const tensor_map& inputs,
                                 const std::vector<int64_t>& bounds, int rank, const rank_collective& mine);

// What rank `rank` gives of a single call's outputs: the token outputs over its piece, the final
// state, and dinitial_* on rank 0 only (what context_parallel_rank returns, to compare with it).
tensor_map rank_share(const tensor_map& outputs, const std::vector<int64_t>& bounds, int rank);

// The same through the C API (expanse_context_parallel_power_attention and its backward, as `whole`'s
// op is power_attention or power_attention_backward): the ranks are threads of this process, each
// with its own context on `backend`. Without `collective` they share device 0 and an all-gather
// through host memory (for a backend whose memory is the host's and whose contexts run in parallel
// threads: the reference); with it, rank r runs on collective(r). Returns the pieces' outputs joined
// (the final state and dinitial_* as rank 0 has them).
tensor_map context_parallel_threads(const std::string& backend, const op_config& whole, const tensor_map& inputs,
                                    const std::vector<int64_t>& bounds,
                                    const std::function<rank_collective(int rank)>& collective = {});

}  // namespace expanse::harness
