// Context parallelism on simulated ranks (context_parallel.hpp; docs/spec.md "Context parallelism").
#include "context_parallel.hpp"

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace expanse::harness {
namespace {

size_t element_size(const host_tensor& x) { return expanse_dtype_size(x.dtype); }

// Elements per index of axis 1 of x [a0, a1, ...].
int64_t inner_of(const host_tensor& x) {
  int64_t inner = 1;
  for (size_t i = 2; i < x.shape.size(); ++i) inner *= x.shape[i];
  return inner;
}

// x[:, first:last] of x [a0, a1, ...] (tokens of a token tensor, ranks of a stacked state).
host_tensor slice_axis1(const host_tensor& x, int64_t first, int64_t last) {
  std::vector<int64_t> shape = x.shape;
  shape[1] = last - first;
  host_tensor out = host_tensor::zeros(x.dtype, shape);
  const size_t row = size_t(inner_of(x)) * element_size(x);
  for (int64_t a = 0; a < x.shape[0]; ++a)
    if (row * size_t(last - first) > 0)
      std::memcpy(out.bytes.data() + size_t(a * (last - first)) * row, x.bytes.data() + size_t(a * x.shape[1] + first) * row,
                  size_t(last - first) * row);
  return out;
}

// dst[:, first:first + n] = src (src [a0, n, ...], the dtypes equal).
void put_axis1(host_tensor& dst, const host_tensor& src, int64_t first) {
  if (src.dtype != dst.dtype) throw std::logic_error("context_parallel: put_axis1 across dtypes");
  const size_t row = size_t(inner_of(dst)) * element_size(dst);
  for (int64_t a = 0; a < dst.shape[0]; ++a)
    if (row * size_t(src.shape[1]) > 0)
      std::memcpy(dst.bytes.data() + size_t(a * dst.shape[1] + first) * row, src.bytes.data() + size_t(a * src.shape[1]) * row,
                  size_t(src.shape[1]) * row);
}

// A state [b, h, ...] as [b, 1, h, ...] and back (the same bytes).
host_tensor with_axis1(host_tensor x) {
  x.shape.insert(x.shape.begin() + 1, 1);
  return x;
}
host_tensor without_axis1(host_tensor x) {
  x.shape.erase(x.shape.begin() + 1);
  return x;
}
// A normalizer [b, h, D] as a state with one value column [b, h, D, 1] (discumsum takes any trailing
// dims; the harness's configs give it [d, e]).
host_tensor as_column(host_tensor x) {
  x.shape.push_back(1);
  return x;
}
host_tensor from_column(host_tensor x) {
  x.shape.pop_back();
  return x;
}

// The states of the ranks stacked along axis 1: [b, R, h, ...].
host_tensor stack_ranks(const std::vector<host_tensor>& states) {
  std::vector<int64_t> shape = states.at(0).shape;
  shape.insert(shape.begin() + 1, int64_t(states.size()));
  host_tensor out = host_tensor::zeros(states[0].dtype, shape);
  for (size_t r = 0; r < states.size(); ++r) put_axis1(out, with_axis1(states[r]), int64_t(r));
  return out;
}

int64_t ranks_of(const std::vector<int64_t>& bounds, int64_t t) {
  if (bounds.size() < 2 || bounds.front() != 0 || bounds.back() != t)
    throw std::invalid_argument("context_parallel: bounds must run from 0 to t");
  for (size_t r = 1; r < bounds.size(); ++r)
    if (bounds[r] <= bounds[r - 1]) throw std::invalid_argument("context_parallel: every piece needs a token");
  return int64_t(bounds.size()) - 1;
}

// The config of one rank's piece of `whole` (tokens [first, last)), with or without an entering state
// and a final state.
op_config piece_config(const op_config& whole, int64_t len, bool entering, bool final_state) {
  op_config c = whole;
  c.t = len;
  c.initial_state = entering;
  c.final_state = final_state;
  return c;
}

// The token inputs (q, k, v, log_g and for a backward o, dout) of a piece; nothing else.
tensor_map piece_inputs(const tensor_map& inputs, int64_t first, int64_t last) {
  tensor_map in;
  for (const char* name : {"q", "k", "v", "log_g", "o", "dout"}) {
    auto it = inputs.find(name);
    if (it != inputs.end()) in[name] = slice_axis1(it->second, first, last);
  }
  return in;
}

// discumsum over the ranks of a stacked state X [b, R, h, D, e] (or a normalizer as [b, R, h, D, 1]).
op_config combination_config(const op_config& whole, int64_t ranks, int64_t rows, int64_t cols, expanse_dtype dtype,
                             bool initial) {
  op_config c;
  c.op = expanse::ops::discumsum;
  c.b = whole.b, c.h = c.hq = whole.h, c.t = ranks, c.c = 1, c.d = rows, c.e = cols;
  c.dtype = dtype;
  c.initial_state = initial;
  return c;
}

// What each rank computes before any exchange: sequence_state of its piece, the final state from zero
// (S and, normalized, z) and the total log decay A_r (-inf where the piece holds a reset).
struct local_pass {
  std::vector<host_tensor> S, z;
  host_tensor A;  // [b, R, h]
};

local_pass run_local(expanse::context& ctx, const op_config& forward, const tensor_map& inputs,
                     const std::vector<int64_t>& bounds, bool oracle) {
  const int64_t R = ranks_of(bounds, forward.t);
  local_pass lp;
  std::vector<host_tensor> decays;
  for (int64_t r = 0; r < R; ++r) {
    op_config c = piece_config(forward, bounds[r + 1] - bounds[r], false, false);
    c.op = expanse::ops::sequence_state;
    c.c = forward.c > 0 ? forward.c : 128;  // the chunks it is computed by (power_attention's 0: one chunk)
    tensor_map in = piece_inputs(inputs, bounds[r], bounds[r + 1]);
    for (const char* name : {"q", "o", "dout"}) in.erase(name);
    const tensor_map out = run_on(ctx, c, in, oracle);
    lp.S.push_back(out.at("S"));
    if (forward.normalize) lp.z.push_back(out.at("z"));
    decays.push_back(out.at("A"));
  }
  lp.A = stack_ranks(decays);
  return lp;
}

// The states entering the pieces and the sequence's final state: discumsum over the ranks,
// Y_0 = the initial state (zero without one), Y_{r+1} = exp(A_r) Y_r + (S_r, z_r). Y [b, R + 1, h, ...].
struct entering_states {
  host_tensor S, z;
};

entering_states combine(expanse::context& ctx, const op_config& forward, const tensor_map& inputs, const local_pass& lp,
                        bool oracle) {
  const int64_t R = int64_t(lp.S.size()), D = lp.S[0].shape[2];
  const expanse_dtype state = lp.S[0].dtype;
  entering_states y;
  const bool initial = forward.initial_state;
  tensor_map in{{"X", stack_ranks(lp.S)}, {"A", lp.A}};
  if (initial) in["Y_init"] = cast(inputs.at("initial_S"), state);
  y.S = run_on(ctx, combination_config(forward, R, D, forward.e, state, initial), in, oracle).at("Y");
  if (forward.normalize) {
    std::vector<host_tensor> cols;
    for (const host_tensor& z : lp.z) cols.push_back(as_column(z));
    tensor_map zin{{"X", stack_ranks(cols)}, {"A", lp.A}};
    if (initial) zin["Y_init"] = as_column(cast(inputs.at("initial_z"), state));
    y.z = run_on(ctx, combination_config(forward, R, D, 1, state, initial), zin, oracle).at("Y");
  }
  return y;
}

// Rank r's entering state as power_attention's initial_S / initial_z.
void put_entering(tensor_map& in, const entering_states& y, int64_t r, bool normalize) {
  in["initial_S"] = without_axis1(slice_axis1(y.S, r, r + 1));
  if (normalize) in["initial_z"] = from_column(without_axis1(slice_axis1(y.z, r, r + 1)));
}

op_config forward_config(const op_config& backward) {
  op_config f = backward;
  f.op = expanse::ops::power_attention;
  return f;
}

// An all-gather among threads through host memory (expanse_allgather_fn): each call deposits this
// rank's block, waits for every rank's, copies them out, and waits until every rank has copied before
// any may start the next round.
struct host_allgather {
  int ranks = 1;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0, departed = 0;
  int64_t round = 0;
  bool failed = false;  // a rank gave up: the others return an error instead of waiting for it
  std::vector<std::vector<char>> blocks;

  void fail() {
    std::lock_guard<std::mutex> lock(m);
    failed = true;
    cv.notify_all();
  }

  struct rank_view {
    host_allgather* shared;
    int rank;
  };
  static int32_t gather(const void* send, void* recv, size_t bytes, void*, void* user) {
    const rank_view& me = *static_cast<rank_view*>(user);
    host_allgather& g = *me.shared;
    std::unique_lock<std::mutex> lock(g.m);
    const int64_t round = g.round;
    g.blocks[size_t(me.rank)].assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    if (++g.arrived == g.ranks) g.cv.notify_all();
    g.cv.wait(lock, [&] { return g.arrived == g.ranks || g.round != round || g.failed; });
    if (g.failed) return 1;
    for (int r = 0; r < g.ranks; ++r) {
      if (g.blocks[size_t(r)].size() != bytes) return 1;  // ranks that disagree on the exchange's size
      std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes, g.blocks[size_t(r)].data(), bytes);
    }
    if (++g.departed == g.ranks) {
      g.arrived = g.departed = 0;
      ++g.round;
      g.cv.notify_all();
    } else {
      g.cv.wait(lock, [&] { return g.round != round || g.failed; });
    }
    return g.failed ? 1 : 0;
  }
};

}  // namespace

tensor_map context_parallel_forward(expanse::context& ctx, const op_config& whole, const tensor_map& inputs,
                                    const std::vector<int64_t>& bounds, bool oracle) {
  const int64_t R = ranks_of(bounds, whole.t);
  const local_pass lp = run_local(ctx, whole, inputs, bounds, oracle);
  const entering_states y = combine(ctx, whole, inputs, lp, oracle);

  tensor_map result;
  for (int64_t r = 0; r < R; ++r) {
    const bool last = r == R - 1;
    const op_config c = piece_config(whole, bounds[r + 1] - bounds[r], true, last && whole.final_state);
    tensor_map in = piece_inputs(inputs, bounds[r], bounds[r + 1]);
    put_entering(in, y, r, whole.normalize);
    tensor_map out = run_on(ctx, c, in, oracle);
    if (r == 0) {
      std::vector<int64_t> shape = out.at("o").shape;
      shape[1] = whole.t;
      result["o"] = host_tensor::zeros(out.at("o").dtype, shape);
    }
    put_axis1(result.at("o"), out.at("o"), bounds[r]);
    if (last && whole.final_state) {
      result["final_S"] = out.at("final_S");
      if (whole.normalize) result["final_z"] = out.at("final_z");
    }
  }
  return result;
}

tensor_map context_parallel_backward(expanse::context& ctx, const op_config& whole, const tensor_map& inputs,
                                     const std::vector<int64_t>& bounds, bool oracle) {
  const int64_t R = ranks_of(bounds, whole.t);
  const op_config forward = forward_config(whole);
  const local_pass lp = run_local(ctx, forward, inputs, bounds, oracle);
  const entering_states y = combine(ctx, forward, inputs, lp, oracle);
  const expanse_dtype state = lp.S[0].dtype;
  const int64_t D = lp.S[0].shape[2];

  // 1. Each rank's backward from its entering state, without a final state's cotangent: its part of
  // the token gradients and G_r, the cotangent of its entering state.
  std::vector<tensor_map> grads(static_cast<size_t>(R));
  std::vector<host_tensor> G_S, G_z;
  for (int64_t r = 0; r < R; ++r) {
    const op_config c = piece_config(whole, bounds[r + 1] - bounds[r], true, false);
    tensor_map in = piece_inputs(inputs, bounds[r], bounds[r + 1]);
    put_entering(in, y, r, whole.normalize);
    grads[size_t(r)] = run_on(ctx, c, in, oracle);
    G_S.push_back(grads[size_t(r)].at("dinitial_S"));
    if (whole.normalize) G_z.push_back(as_column(grads[size_t(r)].at("dinitial_z")));
  }

  // 2. discumsum_backward over the ranks: dY_r = G_r for r < R and dY_R = dfinal give the cotangents
  // of the pieces' own final states (dX), of their total decays (dA) and of the initial state.
  const bool initial = whole.initial_state;
  auto combination_backward = [&](std::vector<host_tensor> cotangents, const host_tensor& dfinal,
                                  const std::vector<host_tensor>& X, const char* initial_name, int64_t cols) {
    cotangents.push_back(dfinal);
    op_config c = combination_config(forward, R, D, cols, state, initial);
    c.op = expanse::ops::discumsum_backward;
    tensor_map in{{"X", stack_ranks(X)}, {"A", lp.A}, {"dY", stack_ranks(cotangents)}};
    if (initial) {
      host_tensor y0 = cast(inputs.at(initial_name), state);
      in["Y_init"] = cols == 1 ? as_column(y0) : y0;
    }
    return run_on(ctx, c, in, oracle);
  };
  auto final_cotangent = [&](const char* name, const host_tensor& like) {
    return whole.final_state ? cast(inputs.at(name), state) : host_tensor::zeros(state, like.shape);
  };
  const tensor_map back_S = combination_backward(G_S, final_cotangent("dfinal_S", lp.S[0]), lp.S, "initial_S", whole.e);
  tensor_map back_z;
  if (whole.normalize) {
    std::vector<host_tensor> z_cols;
    for (const host_tensor& z : lp.z) z_cols.push_back(as_column(z));
    back_z = combination_backward(G_z, as_column(final_cotangent("dfinal_z", lp.z[0])), z_cols, "initial_z", 1);
  }

  // 3. Each rank takes its final state's cotangent back to k, v and log_g: the backward of its piece
  // from zero with that cotangent and no dout; and dA_r to every log_g of the piece.
  tensor_map result;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t first = bounds[r], len = bounds[r + 1] - bounds[r];
    const op_config c = piece_config(whole, len, false, true);
    tensor_map in = piece_inputs(inputs, first, bounds[r + 1]);
    // No dout: then o (the piece's output, here from its entering state) meets only zeros.
    in["dout"] = host_tensor::zeros(in.at("dout").dtype, in.at("dout").shape);
    in["dfinal_S"] = without_axis1(slice_axis1(back_S.at("dX"), r, r + 1));
    if (whole.normalize) in["dfinal_z"] = from_column(without_axis1(slice_axis1(back_z.at("dX"), r, r + 1)));
    const tensor_map own = run_on(ctx, c, in, oracle);
    tensor_map& g = grads[size_t(r)];
    for (auto& [name, x] : g) {
      if (!own.count(name)) continue;  // dinitial_*: from the combination below
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, x.get(i) + own.at(name).get(i));
    }
    if (whole.gated) {
      host_tensor& dlog_g = g.at("dlog_g");  // [b, len, h]
      for (int64_t bi = 0; bi < whole.b; ++bi)
        for (int64_t hi = 0; hi < whole.h; ++hi) {
          const double dA = back_S.at("dA").get((bi * R + r) * whole.h + hi) +
                            (whole.normalize ? back_z.at("dA").get((bi * R + r) * whole.h + hi) : 0.0);
          for (int64_t i = 0; i < len; ++i) {
            const int64_t at = (bi * len + i) * whole.h + hi;
            dlog_g.set(at, dlog_g.get(at) + dA);
          }
        }
    }
    for (const char* name : {"dq", "dk", "dv", "dlog_g"}) {
      if (!g.count(name)) continue;
      if (r == 0) {
        std::vector<int64_t> shape = g.at(name).shape;
        shape[1] = whole.t;
        result[name] = host_tensor::zeros(g.at(name).dtype, shape);
      }
      put_axis1(result.at(name), g.at(name), first);
    }
  }
  if (initial) {
    result["dinitial_S"] = back_S.at("dY_init");
    if (whole.normalize) result["dinitial_z"] = from_column(back_z.at("dY_init"));
  }
  return result;
}

}  // namespace expanse::harness

namespace expanse::harness {

tensor_map context_parallel_rank(const std::string& backend, const op_config& whole, const tensor_map& inputs,
                                 const std::vector<int64_t>& bounds, int rank, const rank_collective& mine) {
  const int64_t R = ranks_of(bounds, whole.t);
  const bool backward = whole.op == expanse::ops::power_attention_backward;
  expanse::context ctx(backend, mine.device);
  const expanse_context_parallel cp{int32_t(rank), int32_t(R), mine.allgather, mine.user};
  const op_config c = piece_config(whole, bounds[rank + 1] - bounds[rank], whole.initial_state, whole.final_state);
  tensor_map in = piece_inputs(inputs, bounds[rank], bounds[rank + 1]);
  for (const char* name : {"initial_S", "initial_z", "dfinal_S", "dfinal_z"})  // the same on every rank
    if (inputs.count(name)) in[name] = inputs.at(name);
  prepared_run run(ctx, c, in, /*oracle=*/whole.dtype == EXPANSE_F64);
  run.call_with_args([&](void* args) {
    expanse::check(backward ? expanse_context_parallel_power_attention_backward(
                                  ctx.get(), &cp, static_cast<const expanse_power_attention_backward_args*>(args))
                            : expanse_context_parallel_power_attention(
                                  ctx.get(), &cp, static_cast<const expanse_power_attention_args*>(args)));
  });
  return run.download();
}

namespace {
// The outputs over the tokens (the others are states).
bool is_token_output(const std::string& name) {
  return name == "o" || name == "dq" || name == "dk" || name == "dv" || name == "dlog_g";
}
}  // namespace

tensor_map rank_share(const tensor_map& outputs, const std::vector<int64_t>& bounds, int rank) {
  tensor_map share;
  for (const auto& [name, x] : outputs) {
    if (is_token_output(name)) share[name] = slice_axis1(x, bounds[size_t(rank)], bounds[size_t(rank) + 1]);
    else if (rank == 0 || name.rfind("dinitial_", 0) != 0) share[name] = x;
  }
  return share;
}

tensor_map context_parallel_threads(const std::string& backend, const op_config& whole, const tensor_map& inputs,
                                    const std::vector<int64_t>& bounds,
                                    const std::function<rank_collective(int rank)>& collective) {
  const int64_t R = ranks_of(bounds, whole.t);
  host_allgather shared;
  shared.ranks = int(R);
  shared.blocks.resize(size_t(R));
  std::vector<tensor_map> outs(static_cast<size_t>(R));
  std::vector<std::string> errors(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < R; ++r)
    threads.emplace_back([&, r] {
      try {
        host_allgather::rank_view me{&shared, int(r)};
        const rank_collective mine = collective ? collective(int(r)) : rank_collective{0, &host_allgather::gather, &me};
        outs[size_t(r)] = context_parallel_rank(backend, whole, inputs, bounds, int(r), mine);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        shared.fail();  // the other ranks stop waiting for this one
      }
    });
  for (std::thread& th : threads) th.join();
  for (int64_t r = 0; r < R; ++r)
    if (!errors[size_t(r)].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[size_t(r)]);

  tensor_map result;
  for (const auto& [name, x] : outs[0]) {
    if (is_token_output(name)) {
      std::vector<int64_t> shape = x.shape;
      shape[1] = whole.t;
      host_tensor joined = host_tensor::zeros(x.dtype, shape);
      for (int64_t r = 0; r < R; ++r) put_axis1(joined, outs[size_t(r)].at(name), bounds[r]);
      result[name] = std::move(joined);
    } else {
      result[name] = x;  // final_S, final_z (every rank's), dinitial_S, dinitial_z (rank 0's)
    }
  }
  return result;
}

}  // namespace expanse::harness
