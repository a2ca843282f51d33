// The plugin loader's failure paths, with test-only modules found through EXPANSE_BACKEND_PATH
// (set by ctest): a working plugin that declines everything, one built for another ABI version,
// one without a device, one without the entry point, and a file that is no shared object.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "expanse/expanse.hpp"

namespace {
std::map<std::string, expanse_backend_info> by_name() {
  std::map<std::string, expanse_backend_info> m;
  for (const expanse_backend_info& b : expanse::backends()) m[b.name] = b;
  return m;
}
}  // namespace

TEST_CASE("every module is listed, available or with the reason it is not") {
  const auto all = by_name();
  REQUIRE(all.count("reference"));
  CHECK(all.at("reference").available == 1);
  REQUIRE(all.count("testnull"));
  CHECK(all.at("testnull").available == 1);
  CHECK(all.at("testnull").device_count == 1);
  REQUIRE(all.count("wrongabi"));
  CHECK(all.at("wrongabi").available == 0);
  CHECK(std::string(all.at("wrongabi").reason).find("ABI version") != std::string::npos);
  REQUIRE(all.count("nodevice"));
  CHECK(all.at("nodevice").available == 0);
  CHECK(std::string(all.at("nodevice").reason) == "no test device present");
  REQUIRE(all.count("noentry"));
  CHECK(std::string(all.at("noentry").reason).find("exports no") != std::string::npos);
  REQUIRE(all.count("garbage"));
  CHECK(std::string(all.at("garbage").reason).find("cannot load module") != std::string::npos);
}

TEST_CASE("selecting an unavailable plugin is a clear error") {
  for (const char* name : {"wrongabi", "nodevice", "noentry", "garbage"}) {
    expanse_context* ctx = nullptr;
    CHECK(expanse_context_create(name, 0, &ctx) == EXPANSE_ERROR_BACKEND);
    const std::string message = expanse_last_error();
    INFO(message);
    CHECK(message.find(name) != std::string::npos);
    CHECK(message.find("unavailable") != std::string::npos);
    CHECK(ctx == nullptr);
  }
}

TEST_CASE("a plugin that declines an operation says why") {
  expanse::context ctx("testnull");
  std::vector<float> x(8, 1.0f), out(36);
  expanse_tensor tx = expanse::tensor(x.data(), {1, 8}), tout = expanse::tensor(out.data(), {1, 36});
  auto a = expanse::sympow_expand_args();
  a.x = &tx; a.out = &tout;
  std::string reason;
  CHECK_FALSE(ctx.supports(EXPANSE_OP_SYMPOW_EXPAND, &a, &reason));
  CHECK(reason.find("implements no operation") != std::string::npos);
  try {
    ctx.sympow_expand(a);
    FAIL("expected an error");
  } catch (const expanse::error& e) {
    CHECK(e.status() == EXPANSE_ERROR_UNSUPPORTED);
    CHECK(std::string(e.what()).find("testnull") != std::string::npos);
  }
}

TEST_CASE("EXPANSE_BACKEND selects the default backend") {
  // ctest sets EXPANSE_BACKEND to the empty string: the default is the reference.
  CHECK(std::string(expanse_default_backend()) == "reference");
  setenv("EXPANSE_BACKEND", "testnull", 1);
  expanse::context ctx;
  CHECK(ctx.backend() == "testnull");
  unsetenv("EXPANSE_BACKEND");
}
