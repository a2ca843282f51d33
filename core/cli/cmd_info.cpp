// `expanse info`: the library version, the default backend, and every backend the registry knows
// with its availability, module, ABI version and devices.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli_options.hpp"
#include "commands.hpp"
#include "expanse/expanse.h"

using namespace expanse_cli;

namespace {

// A fixed-size char field from an info struct, safe even if the library forgot the terminator.
template <size_t N>
std::string field(const char (&s)[N]) {
  size_t n = 0;
  while (n < N && s[n] != '\0') ++n;
  return std::string(s, n);
}

const char* device_type_name(int32_t t) {
  switch (t) {
    case EXPANSE_DEVICE_CPU: return "cpu";
    case EXPANSE_DEVICE_CUDA: return "cuda";
    case EXPANSE_DEVICE_ROCM: return "rocm";
    default: return "unknown device type";
  }
}

const char kAbout[] =
    "Prints the library version, the default backend ($EXPANSE_BACKEND or \"reference\"), the\n"
    "plugin search path $EXPANSE_BACKEND_PATH, and every backend found: whether it is available\n"
    "(and why not), its module file, plugin ABI version and devices. Listing loads every plugin\n"
    "module found. When the default backend is missing or unavailable, the default backend line\n"
    "says so and why (and so does a warning on stderr); the exit status stays 0.\n";

// One entry of the backend list: its information, or why there is none.
struct Listed {
  expanse_backend_info info{};
  std::string error;
};

std::vector<Listed> list_backends() {
  std::vector<Listed> out(static_cast<size_t>(std::max(expanse_backend_count(), 0)));
  for (size_t i = 0; i < out.size(); ++i)
    if (expanse_backend_get_info(static_cast<int32_t>(i), &out[i].info) != EXPANSE_OK) out[i].error = expanse_last_error();
  return out;
}

// Why the default backend cannot be used ("" when it can): every other command would fail with it.
std::string default_backend_problem(const std::string& name, const std::vector<Listed>& listed) {
  for (const Listed& b : listed)
    if (b.error.empty() && field(b.info.name) == name)
      return b.info.available ? std::string() : "unavailable: " + field(b.info.reason);
  return "missing: no backend of that name was found (the built-in reference, or a module libexpanse-" + name +
         ".so beside libexpanse.so or in $EXPANSE_BACKEND_PATH)";
}

int info() {
  const char* version = expanse_version();
  std::printf("expanse %s\n", version ? version : "(unknown version)");

  const std::vector<Listed> listed = list_backends();
  const std::string def = expanse_default_backend();
  const char* env_backend = std::getenv("EXPANSE_BACKEND");
  const std::string problem = default_backend_problem(def, listed);
  std::printf("default backend: %s%s%s\n", def.c_str(), (env_backend && *env_backend) ? "  (from $EXPANSE_BACKEND)" : "",
              problem.empty() ? "" : ("  NOT USABLE: " + problem).c_str());
  if (!problem.empty())
    std::fprintf(stderr, "expanse: warning: the default backend '%s' is not usable: %s\n", def.c_str(), problem.c_str());
  const char* path = std::getenv("EXPANSE_BACKEND_PATH");
  std::printf("EXPANSE_BACKEND_PATH: %s\n", (path && *path) ? path : "(not set)");

  std::printf("backends: %zu\n", listed.size());
  for (size_t i = 0; i < listed.size(); ++i) {
    if (!listed[i].error.empty()) {
      std::printf("  [%zu] (no information: %s)\n", i, listed[i].error.c_str());
      continue;
    }
    const expanse_backend_info& bi = listed[i].info;
    const std::string name = field(bi.name);
    const std::string module = field(bi.path);
    std::printf("  %s: %s\n", name.c_str(),
                bi.available ? "available" : ("not available: " + field(bi.reason)).c_str());
    std::printf("    module: %s\n", module.empty() ? "(built into libexpanse)" : module.c_str());
    std::printf("    ABI version: %u\n", static_cast<unsigned>(bi.abi_version));
    if (!bi.available) continue;
    std::printf("    devices: %d\n", bi.device_count);
    for (int32_t dev = 0; dev < bi.device_count; ++dev) {
      expanse_device_info di{};
      if (expanse_backend_device_info(name.c_str(), dev, &di) != EXPANSE_OK) {
        std::printf("    [%d] (no information: %s)\n", dev, expanse_last_error());
        continue;
      }
      std::string line = "    [" + std::to_string(dev) + "] " + field(di.name) + " (" +
                         device_type_name(di.device_type) + ")";
      if (di.compute_major != 0 || di.compute_minor != 0)
        line += ", compute capability " + std::to_string(di.compute_major) + "." +
                std::to_string(di.compute_minor);
      if (di.multiprocessors > 0)
        line += ", " + std::to_string(di.multiprocessors) +
                (di.device_type == EXPANSE_DEVICE_CPU    ? " cores"
                 : di.device_type == EXPANSE_DEVICE_ROCM ? " CUs"
                                                         : " SMs");
      char mem[64];
      std::snprintf(mem, sizeof mem, ", %.1f GiB", static_cast<double>(di.memory_bytes) / (1ull << 30));
      if (di.memory_bytes > 0) line += mem;
      std::printf("%s\n", line.c_str());
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command add_info(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "version, backends and devices");
  set_usage(cmd, "");
  cmd->footer(kAbout);
  return {cmd, info};
}
