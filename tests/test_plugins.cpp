// The plugin loader's failure paths, with test-only modules found through EXPANSE_BACKEND_PATH
// (set by ctest): a working plugin that declines everything, one built for another ABI version,
// one without a device, one without the entry point, and a file that is no shared object. The path
// also reaches the modules' folder through a symbolic link and twice, and holds a folder of things
// named like plugins that are not regular files (a FIFO, a directory).
//
// The test cases named "lazily: ..." look at which modules a fresh process has loaded, so ctest runs
// each in a process of its own and leaves them out of the main run.
#include <dlfcn.h>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "expanse/expanse.hpp"

namespace {
std::map<std::string, expanse_backend_info> by_name() {
  std::map<std::string, expanse_backend_info> m;
  for (const expanse_backend_info& b : expanse::backends()) m[b.name] = b;
  return m;
}

// Whether the test module libexpanse-<name>.so (in the first folder of EXPANSE_BACKEND_PATH) is
// loaded in this process; RTLD_NOLOAD never loads it.
bool module_loaded(const std::string& name) {
  const std::string path_list = std::getenv("EXPANSE_BACKEND_PATH");
  const std::string dir = path_list.substr(0, path_list.find(':'));
  void* handle = dlopen((dir + "/libexpanse-" + name + ".so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}
}  // namespace

TEST_CASE("lazily: the reference loads no module; a named backend loads only its own") {
  REQUIRE(std::getenv("EXPANSE_BACKEND_PATH"));
  {
    expanse::context ref("reference");
    CHECK(ref.backend() == "reference");
  }
  CHECK_FALSE(module_loaded("testnull"));
  CHECK_FALSE(module_loaded("nodevice"));
  {
    expanse::context ctx("testnull");
    CHECK(ctx.backend() == "testnull");
  }
  CHECK(module_loaded("testnull"));
  CHECK_FALSE(module_loaded("nodevice"));
  // Listing the backends loads every module (nodevice fails its init but stays loaded).
  CHECK(expanse_backend_count() > 1);
  CHECK(module_loaded("nodevice"));
}

TEST_CASE("lazily: contexts created from many threads while modules load") {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([i, &failures] {
      const char* name = i % 3 == 0 ? "reference" : i % 3 == 1 ? "testnull" : "nodevice";
      expanse_context* ctx = nullptr;
      const expanse_status st = expanse_context_create(name, 0, &ctx);
      const bool expected = i % 3 == 2 ? st == EXPANSE_ERROR_BACKEND : st == EXPANSE_OK;
      if (!expected) ++failures;
      if (ctx) expanse_context_destroy(ctx);
      if (i == 7 && expanse_backend_count() < 5) ++failures;
    });
  for (std::thread& t : threads) t.join();
  CHECK(failures.load() == 0);
}

TEST_CASE("a module reached through several paths is listed once") {
  std::map<std::string, int> count;
  for (const expanse_backend_info& b : expanse::backends()) ++count[b.name];
  for (const auto& [name, n] : count) {
    INFO(name);
    CHECK(n == 1);
  }
  CHECK(count.count("testnull") == 1);
}

TEST_CASE("things named like plugins that are not regular files are listed and never opened") {
  const auto all = by_name();
  for (const char* name : {"fifo", "dir"}) {
    INFO(name);
    REQUIRE(all.count(name));
    CHECK(all.at(name).available == 0);
    CHECK(std::string(all.at(name).reason).find("not a regular file") != std::string::npos);
    expanse_context* ctx = nullptr;
    CHECK(expanse_context_create(name, 0, &ctx) == EXPANSE_ERROR_BACKEND);
    CHECK(std::string(expanse_last_error()).find("not a regular file") != std::string::npos);
  }
}

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
