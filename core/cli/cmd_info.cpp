// `expanse info`: the library version, the default backend, and every backend the registry knows
// with its availability, module, ABI version and devices.
#include <cstdio>
#include <cstdlib>
#include <string>

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

void print_help(const ArgParser& args) {
  std::printf(
      "usage: expanse info\n"
      "\n"
      "Prints the library version, the default backend ($EXPANSE_BACKEND or \"reference\"), the\n"
      "plugin search path $EXPANSE_BACKEND_PATH, and every backend found: whether it is available\n"
      "(and why not), its module file, plugin ABI version and devices.\n"
      "\n"
      "options:\n%s",
      args.options_help().c_str());
}

}  // namespace

int cmd_info(int argc, char** argv) {
  ArgParser args("info", {});
  args.parse(argc, argv);
  if (args.help_requested()) {
    print_help(args);
    return 0;
  }
  if (!args.positional().empty())
    throw UsageError("expanse info takes no arguments (got '" + args.positional()[0] + "')");

  const char* version = expanse_version();
  std::printf("expanse %s\n", version ? version : "(unknown version)");

  const char* def = expanse_default_backend();
  const char* env_backend = std::getenv("EXPANSE_BACKEND");
  std::printf("default backend: %s%s\n", def ? def : "(none)",
              (env_backend && *env_backend) ? "  (from $EXPANSE_BACKEND)" : "");
  const char* path = std::getenv("EXPANSE_BACKEND_PATH");
  std::printf("EXPANSE_BACKEND_PATH: %s\n", (path && *path) ? path : "(not set)");

  const int32_t count = expanse_backend_count();
  std::printf("backends: %d\n", count);
  for (int32_t i = 0; i < count; ++i) {
    expanse_backend_info bi{};
    if (expanse_backend_get_info(i, &bi) != EXPANSE_OK) {
      std::printf("  [%d] (no information: %s)\n", i, expanse_last_error());
      continue;
    }
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
