// The GPU plugins' SDK (backends/sdk/) on the CPU: the order of a list, architecture tags, the joined
// reasons, EXPANSE_<NAME>_SKIP, the choice kept in the call's memo, a composed operation's steps
// through their own lists, and the workspace's two passes. The implementations here only record
// what they were asked; no kernel runs.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "sdk/dispatcher.hpp"
#include "sdk/op_args.hpp"

namespace {

using expanse_sdk::device_props;
using expanse_sdk::implementation;
using expanse_sdk::launch_context;

constexpr uint32_t kFast = 1u << 0;
constexpr expanse_sdk::requirement kNeedsFast{kFast, "needs the fast feature"};

std::vector<std::string> g_ran;   // names of the implementations run, in order
int g_declines_calls = 0;         // calls of picky_declines
bool g_picky_takes = true;        // whether "picky" takes its problems

std::string picky_declines(const expanse_op&, const device_props&) {
  ++g_declines_calls;
  return g_picky_takes ? std::string() : "does not want it";
}
std::string takes_all(const expanse_op&, const device_props&) { return {}; }
std::string declines_all(const expanse_op&, const device_props&) { return "never takes anything"; }

template <int kFloats>
void run_named(const char* name, launch_context& lc) {
  float* piece = lc.ws.take<float>(kFloats);
  REQUIRE(piece != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(piece) % 256 == 0);  // in both passes
  if (!lc.ws.sizing()) g_ran.push_back(name);
}
void run_tagged(const expanse_op&, launch_context& lc) { run_named<3>("tagged", lc); }
void run_picky(const expanse_op&, launch_context& lc) { run_named<5>("picky", lc); }
void run_simple(const expanse_op&, launch_context& lc) { run_named<7>("simple", lc); }

expanse_sdk::implementation_lists& test_lists() {
  static expanse_sdk::implementation_lists lists;
  return lists;
}

const expanse_sdk::registered_list kUpdateState(test_lists(), EXPANSE_OP_UPDATE_STATE,
                                                {{"tagged", kNeedsFast, takes_all, run_tagged},
                                                 {"picky", expanse_sdk::any_device, picky_declines, run_picky},
                                                 {"simple", expanse_sdk::any_device, takes_all, run_simple}});
const expanse_sdk::registered_list kDiscumsum(test_lists(), EXPANSE_OP_DISCUMSUM,
                                              {{"never", expanse_sdk::any_device, declines_all, run_simple}});

// A composed operation: update_state twice (two memo slots), then discumsum when asked.
bool g_compose_discumsum = false;
void run_composed(const expanse_op& op, launch_context& lc) {
  const expanse_op step{EXPANSE_OP_UPDATE_STATE, op.args, op.problem, nullptr};
  lc.dispatch.run_step(step, 1, lc);
  lc.dispatch.run_step(step, 2, lc);
  if (g_compose_discumsum) {
    const expanse_op scan{EXPANSE_OP_DISCUMSUM, op.args, op.problem, nullptr};
    lc.dispatch.run_step(scan, 3, lc);
  }
}
const expanse_sdk::registered_list kComposed(test_lists(), EXPANSE_OP_POWER_ATTENTION,
                                             {{"composed", expanse_sdk::any_device, takes_all, run_composed}});

struct call {
  expanse_tensor k{};
  expanse_update_state_args args{};
  expanse_problem problem{};
  int64_t memo[EXPANSE_OP_MEMO_WORDS] = {};
  expanse_op op{};
  explicit call(expanse_op_kind kind, bool with_memo = true) {
    k.device_id = 3;
    args.k = &k;
    op = expanse_op{kind, &args, &problem, with_memo ? memo : nullptr};
  }
};

void reset() {
  g_ran.clear();
  g_declines_calls = 0;
  g_picky_takes = true;
  g_compose_discumsum = false;
}

}  // namespace

TEST_CASE("sdk: every args struct starts with its first tensor; the device is read there") {
  call c(EXPANSE_OP_UPDATE_STATE);
  CHECK(expanse_sdk::first_tensor(c.op) == &c.k);
  CHECK(expanse_sdk::device_of(c.op) == 3);
  CHECK(std::string(expanse_sdk::op_name(EXPANSE_OP_POWER_ATTENTION_STEP)) == "power_attention_step");
}

TEST_CASE("sdk: the first implementation that takes the problem runs; tags and reasons") {
  reset();
  const expanse_sdk::dispatcher d("sdktest", test_lists());
  device_props plain, fast;
  fast.features = kFast;
  {
    call c(EXPANSE_OP_UPDATE_STATE);
    const implementation* impl = d.choose(c.op, fast, nullptr);
    REQUIRE(impl != nullptr);
    CHECK(std::string(impl->name) == "tagged");
    CHECK(c.memo[0] == 1);
  }
  {
    call c(EXPANSE_OP_UPDATE_STATE);
    CHECK(std::string(d.choose(c.op, plain, nullptr)->name) == "picky");  // the tag declines on a plain device
    CHECK(c.memo[0] == 2);
  }
  {
    g_picky_takes = false;
    call c(EXPANSE_OP_DISCUMSUM);
    char reason[256] = {};
    CHECK(d.supports(c.op, plain, reason, sizeof(reason)) == EXPANSE_ERROR_UNSUPPORTED);
    CHECK(std::string(reason) == "never: never takes anything");
    call none(EXPANSE_OP_SYMPOW_EXPAND);  // no list at all
    CHECK(d.supports(none.op, plain, reason, sizeof(reason)) == EXPANSE_ERROR_UNSUPPORTED);
    CHECK(std::string(reason) == "no implementation of this operation");
  }
}

TEST_CASE("sdk: one choice per call, kept in the memo through supports, workspace_size and run") {
  reset();
  const expanse_sdk::dispatcher d("sdktest", test_lists());
  device_props plain;
  call c(EXPANSE_OP_UPDATE_STATE);
  CHECK(d.supports(c.op, plain, nullptr, 0) == EXPANSE_OK);
  CHECK(g_declines_calls == 1);
  g_picky_takes = false;  // a second look would now choose "simple"; the call keeps "picky"
  size_t bytes = 0;
  CHECK(d.workspace_size(c.op, plain, &bytes) == EXPANSE_OK);
  CHECK(bytes == 255 + 5 * sizeof(float));
  std::vector<char> ws(bytes);
  expanse_exec exec{0, nullptr, ws.data(), ws.size()};
  CHECK(d.run(c.op, plain, exec, nullptr, 0) == EXPANSE_OK);
  CHECK(g_declines_calls == 1);
  CHECK(g_ran == std::vector<std::string>{"picky"});

  // Without a memo every call chooses afresh.
  call fresh(EXPANSE_OP_UPDATE_STATE, false);
  g_ran.clear();
  std::vector<char> larger(1024);
  exec = expanse_exec{0, nullptr, larger.data(), larger.size()};
  CHECK(d.run(fresh.op, plain, exec, nullptr, 0) == EXPANSE_OK);
  CHECK(g_ran == std::vector<std::string>{"simple"});
}

TEST_CASE("sdk: a workspace too small is reported before anything runs") {
  reset();
  const expanse_sdk::dispatcher d("sdktest", test_lists());
  call c(EXPANSE_OP_UPDATE_STATE);
  std::vector<char> ws(16);
  expanse_exec exec{0, nullptr, ws.data(), ws.size()};
  char err[256] = {};
  CHECK(d.run(c.op, device_props{}, exec, err, sizeof(err)) == EXPANSE_ERROR_WORKSPACE);
  CHECK(std::string(err).rfind("sdktest: update_state needs a workspace of ", 0) == 0);
  CHECK(g_ran.empty());
}

TEST_CASE("sdk: EXPANSE_<NAME>_SKIP passes over implementations by name") {
  reset();
  setenv("EXPANSE_SDKSKIP_SKIP", "tagged,picky", 1);
  const expanse_sdk::dispatcher d("sdkskip", test_lists());
  unsetenv("EXPANSE_SDKSKIP_SKIP");
  device_props fast;
  fast.features = kFast;
  call c(EXPANSE_OP_UPDATE_STATE);
  CHECK(std::string(d.choose(c.op, fast, nullptr)->name) == "simple");
  CHECK(g_declines_calls == 0);
  g_picky_takes = false;
  call all_skipped(EXPANSE_OP_DISCUMSUM);
  std::string reasons;
  CHECK(d.choose(all_skipped.op, fast, &reasons) == nullptr);
  CHECK(reasons == "never: never takes anything");
  setenv("EXPANSE_SDKSKIP2_SKIP", "simple,picky", 1);
  const expanse_sdk::dispatcher d2("sdkskip2", test_lists());
  unsetenv("EXPANSE_SDKSKIP2_SKIP");
  call c2(EXPANSE_OP_UPDATE_STATE);
  CHECK(d2.choose(c2.op, device_props{}, &reasons) == nullptr);
  CHECK(reasons ==
        "tagged: needs the fast feature; picky: skipped (EXPANSE_SDKSKIP2_SKIP); simple: skipped (EXPANSE_SDKSKIP2_SKIP)");
}

TEST_CASE("sdk: a composed operation runs its steps through their lists, each chosen once per call") {
  reset();
  const expanse_sdk::dispatcher d("sdktest", test_lists());
  device_props plain;
  call c(EXPANSE_OP_POWER_ATTENTION);
  size_t bytes = 0;
  CHECK(d.workspace_size(c.op, plain, &bytes) == EXPANSE_OK);
  CHECK(bytes == 2 * (255 + 5 * sizeof(float)));
  CHECK(g_declines_calls == 2);  // once per step slot
  CHECK(c.memo[0] == 1);
  CHECK(c.memo[1] == (int64_t(2) << 16 | 2));  // slots 1 and 2: "picky" (index 1) each
  g_picky_takes = false;
  std::vector<char> ws(bytes);
  expanse_exec exec{0, nullptr, ws.data(), ws.size()};
  CHECK(d.run(c.op, plain, exec, nullptr, 0) == EXPANSE_OK);
  CHECK(g_ran == std::vector<std::string>{"picky", "picky"});
  CHECK(g_declines_calls == 2);

  // A step no implementation takes makes the composed operation unsupported, with the step's reasons.
  g_compose_discumsum = true;
  call with_scan(EXPANSE_OP_POWER_ATTENTION);
  char reason[256] = {};
  CHECK(d.supports(with_scan.op, plain, reason, sizeof(reason)) == EXPANSE_ERROR_UNSUPPORTED);
  CHECK(std::string(reason) == "power_attention step discumsum: never: never takes anything");
}
