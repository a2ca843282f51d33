// libFuzzer harness for the .npy reader of the `expanse` command (core/cli/npy.cpp).
//
// The input is the bytes of a .npy file. It is read through npy_read from an in-memory file (a
// memfd, opened by its /proc/self/fd path, so nothing touches the disk); an input that does not
// start with the .npy magic string is also given to npy_parse_header as header text. Checked:
// every rejection is a std::runtime_error (any other exception, crash or sanitizer report fails),
// an accepted array has exactly numel * element size bytes, writing it back with npy_write and
// reading that again gives the same dtype, shape and bytes, and it converts to every dtype.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "npy.hpp"

namespace {

// An in-memory file and the path that opens it.
struct mem_file {
  int fd = -1;
  std::string path;
  explicit mem_file(const char* name) {
    fd = memfd_create(name, 0);
    if (fd < 0) {
      std::perror("fuzz_npy: memfd_create");
      std::abort();
    }
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  void assign(const uint8_t* data, size_t size) {
    if (ftruncate(fd, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t w = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
      if (w <= 0) std::abort();
      done += static_cast<size_t>(w);
    }
  }
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_npy: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mem_file input("fuzz_npy_in"), copy("fuzz_npy_copy");
  using namespace expanse_cli;

  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 6 || std::memcmp(data, kMagic, 6) != 0) {
    try {
      npy_parse_header(std::string(reinterpret_cast<const char*>(data), size), "<fuzz header>");
    } catch (const std::runtime_error&) {
    }
  }

  input.assign(data, size);
  NpyArray a;
  try {
    a = npy_read(input.path);
  } catch (const std::runtime_error&) {
    return 0;  // rejected with a message: fine
  }
  if (a.shape.size() > EXPANSE_MAX_DIMS) fail("accepted a rank above EXPANSE_MAX_DIMS");
  const int64_t n = checked_numel(a.shape, "fuzz");
  if (a.data.size() != static_cast<uint64_t>(n) * dtype_bytes(a.dtype)) fail("data size does not match the shape");

  npy_write(copy.path, a);
  const NpyArray b = npy_read(copy.path);
  if (b.dtype != a.dtype || b.shape != a.shape || b.data != a.data) fail("write + read does not round-trip");

  for (expanse_dtype to : {EXPANSE_F16, EXPANSE_BF16, EXPANSE_F32, EXPANSE_F64}) {
    const NpyArray c = convert_array(a, to);
    if (c.dtype != to || c.shape != a.shape || c.data.size() != static_cast<size_t>(n) * dtype_bytes(to))
      fail("convert_array gave a wrong dtype, shape or size");
  }
  return 0;
}
