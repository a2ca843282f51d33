// NumPy .npy reading and writing, and dtype conversions of host buffers (see npy.hpp).
//
// Format (numpy.lib.format): "\x93NUMPY", major, minor, header length (uint16 LE for 1.0, uint32 LE
// for 2.0 and 3.0), then a Python dict literal padded with spaces and ending in '\n', then the data.
#include "npy.hpp"

#include "cases.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <utility>

#include <sys/stat.h>

namespace expanse_cli {

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& text) {
  throw std::runtime_error("file " + file + " " + text);
}

bool host_is_little_endian() {
  const uint16_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// ---------------------------------------------------------------- header dictionary parser

class DictParser {
 public:
  DictParser(const std::string& text, const std::string& file) : s_(text), file_(file) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    expect('{', "the header must start with '{'");
    while (true) {
      skip_ws();
      if (peek() == '}') {
        ++i_;
        break;
      }
      const std::string key = parse_string("a quoted key");
      skip_ws();
      expect(':', "expected ':' after key '" + key + "'");
      skip_ws();
      if (key == "descr") {
        if (have_descr) bad("key 'descr' appears twice");
        have_descr = true;
        if (peek() == '[')
          fail(file_, "has a structured dtype (a list in 'descr'); expanse reads only float16, "
                      "float32 and float64 arrays");
        h.descr = parse_string("a quoted dtype string for 'descr'");
      } else if (key == "fortran_order") {
        if (have_fortran) bad("key 'fortran_order' appears twice");
        have_fortran = true;
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (have_shape) bad("key 'shape' appears twice");
        have_shape = true;
        h.shape = parse_shape();
      } else {
        bad("unexpected key '" + key + "' (a .npy header has exactly descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip_ws();
      if (peek() == '}') {
        ++i_;
        break;
      }
      bad("expected ',' or '}' after the value of '" + key + "'");
    }
    skip_ws();
    if (i_ != s_.size()) bad("unexpected text after the closing '}'");
    if (!have_descr) bad("the header has no 'descr' key");
    if (!have_fortran) bad("the header has no 'fortran_order' key");
    if (!have_shape) bad("the header has no 'shape' key");
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(file_, "has a malformed .npy header (" + what + ", at offset " + std::to_string(i_) +
                    " of the header text)");
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  void expect(char c, const std::string& what) {
    if (peek() != c) bad(what);
    ++i_;
  }
  std::string parse_string(const std::string& what) {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected " + what);
    ++i_;
    std::string out;
    while (true) {
      if (i_ >= s_.size()) bad("unterminated string");
      const char c = s_[i_++];
      if (c == q) break;
      if (c == '\\') {
        if (i_ >= s_.size()) bad("unterminated string");
        out += s_[i_++];
        continue;
      }
      out += c;
    }
    return out;
  }
  bool parse_bool() {
    if (s_.compare(i_, 4, "True") == 0) {
      i_ += 4;
      return true;
    }
    if (s_.compare(i_, 5, "False") == 0) {
      i_ += 5;
      return false;
    }
    bad("expected True or False for 'fortran_order'");
  }
  int64_t parse_dim() {
    if (peek() == '-') bad("negative dimension in 'shape'");
    if (peek() < '0' || peek() > '9') bad("expected a non-negative integer in 'shape'");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) bad("dimension too large in 'shape'");
      v = v * 10 + digit;
      ++i_;
    }
    if (peek() == 'L' || peek() == 'l') ++i_;  // Python 2 longs: (3L, 4L)
    return v;
  }
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(', "expected a tuple such as (3, 4), (5,) or () for 'shape'");
    skip_ws();
    if (peek() == ')') {
      ++i_;
      return shape;
    }
    while (true) {
      skip_ws();
      shape.push_back(parse_dim());
      if (shape.size() > EXPANSE_MAX_DIMS) {
        fail(file_, "has more than " + std::to_string(EXPANSE_MAX_DIMS) +
                        " dimensions, which expanse does not support");
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        skip_ws();
        if (peek() == ')') {
          ++i_;
          break;
        }
        continue;
      }
      if (peek() == ')') {
        // Python needs a trailing comma for a 1-tuple, (5) is just 5; numpy never writes that.
        if (shape.size() == 1) bad("a 1-d shape must be written (n,), with a comma");
        ++i_;
        break;
      }
      bad("expected ',' or ')' in 'shape'");
    }
    return shape;
  }

  const std::string& s_;
  const std::string& file_;
  size_t i_ = 0;
};

// descr -> dtype and byte order. Throws with a clear message for everything else.
void parse_descr(const std::string& descr, const std::string& file, expanse_dtype* dtype,
                 bool* big_endian) {
  if (descr.size() == 3 && (descr[0] == '<' || descr[0] == '>' || descr[0] == '=') &&
      descr[1] == 'f') {
    *big_endian = descr[0] == '>' || (descr[0] == '=' && !host_is_little_endian());
    switch (descr[2]) {
      case '2': *dtype = EXPANSE_F16; return;
      case '4': *dtype = EXPANSE_F32; return;
      case '8': *dtype = EXPANSE_F64; return;
      default: break;
    }
  }
  std::string hint;
  if (descr == "<V2" || descr == "|V2" || descr == "bfloat16")
    hint = " (bfloat16 arrays from ml_dtypes are stored as raw 2-byte records and cannot be read: "
           "save them as float32 and use --dtype bf16)";
  else if (descr.size() >= 2 && descr[1] == 'f')
    hint = " (unsupported float size)";
  fail(file, "has dtype '" + descr +
                 "'; expanse reads only float16, float32 and float64 arrays ('<f2', '<f4', '<f8')" +
                 hint);
}

void byteswap_elements(unsigned char* p, size_t count, size_t elem) {
  for (size_t i = 0; i < count; ++i, p += elem)
    for (size_t a = 0, b = elem - 1; a < b; ++a, --b) std::swap(p[a], p[b]);
}

uint32_t read_le(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// ---------------------------------------------------------------- dtypes

size_t dtype_bytes(expanse_dtype dtype) {
  switch (dtype) {
    case EXPANSE_F16:
    case EXPANSE_BF16: return 2;
    case EXPANSE_F32: return 4;
    case EXPANSE_F64: return 8;
    default: return 0;
  }
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what,
                      size_t elem_bytes) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::runtime_error(what + ": negative dimension in shape");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw std::runtime_error(what + ": the number of elements overflows 64 bits");
    n *= d;
  }
  if (elem_bytes != 0) {
    const uint64_t limit = std::min<uint64_t>(std::numeric_limits<size_t>::max(),
                                              static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (static_cast<uint64_t>(n) > limit / elem_bytes)
      throw std::runtime_error(what + ": the size in bytes overflows");
  }
  return n;
}

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}


double load_as_double(const void* data, expanse_dtype dtype, size_t index) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case EXPANSE_F16: {
      uint16_t b;
      std::memcpy(&b, p + 2 * index, 2);
      return expanse::harness::f16_to_double(b);
    }
    case EXPANSE_BF16: {
      uint16_t b;
      std::memcpy(&b, p + 2 * index, 2);
      return expanse::harness::bf16_to_double(b);
    }
    case EXPANSE_F32: {
      float f;
      std::memcpy(&f, p + 4 * index, 4);
      return f;
    }
    case EXPANSE_F64: {
      double d;
      std::memcpy(&d, p + 8 * index, 8);
      return d;
    }
  }
  throw std::invalid_argument("load_as_double: unknown dtype " + std::to_string(dtype));
}

void store_from_double(void* data, expanse_dtype dtype, size_t index, double v) {
  unsigned char* p = static_cast<unsigned char*>(data);
  switch (dtype) {
    case EXPANSE_F16: {
      const uint16_t b = expanse::harness::double_to_f16(v);
      std::memcpy(p + 2 * index, &b, 2);
      return;
    }
    case EXPANSE_BF16: {
      const uint16_t b = expanse::harness::double_to_bf16(v);
      std::memcpy(p + 2 * index, &b, 2);
      return;
    }
    case EXPANSE_F32: {
      float f;
      if (std::isfinite(v) && std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
        // Out of float's range: the cast is undefined in C++; round like IEEE does.
        const double limit = std::ldexp(2.0 - std::ldexp(1.0, -24), 127);  // max + half an ulp
        f = std::fabs(v) >= limit ? std::copysign(std::numeric_limits<float>::infinity(), v)
                                  : std::copysign(std::numeric_limits<float>::max(), v);
      } else {
        f = static_cast<float>(v);
      }
      std::memcpy(p + 4 * index, &f, 4);
      return;
    }
    case EXPANSE_F64: std::memcpy(p + 8 * index, &v, 8); return;
  }
  throw std::invalid_argument("store_from_double: unknown dtype " + std::to_string(dtype));
}

void convert_elements(const void* src, expanse_dtype src_dtype, void* dst, expanse_dtype dst_dtype,
                      size_t count) {
  if (src_dtype == dst_dtype) {
    if (count != 0 && src != dst) std::memmove(dst, src, count * dtype_bytes(src_dtype));
    return;
  }
  for (size_t i = 0; i < count; ++i)
    store_from_double(dst, dst_dtype, i, load_as_double(src, src_dtype, i));
}

NpyArray convert_array(const NpyArray& a, expanse_dtype dtype) {
  if (a.dtype == dtype) return a;
  NpyArray out;
  out.dtype = dtype;
  out.shape = a.shape;
  const size_t n = static_cast<size_t>(a.numel());
  out.data.resize(n * dtype_bytes(dtype));
  convert_elements(a.data.data(), a.dtype, out.data.data(), dtype, n);
  return out;
}

// ---------------------------------------------------------------- reading

NpyHeader npy_parse_header(const std::string& text, const std::string& file) {
  return DictParser(text, file).parse();
}

namespace {
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}
}  // namespace

void require_regular_file(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) fail(path, std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    fail(path, std::string("is not a regular file (") + file_kind(st.st_mode) + "): only regular files are read");
}

NpyArray npy_read(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot be opened for reading: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) fail(path, "has no size that can be read (not a regular file?)");
  in.seekg(0, std::ios::beg);
  const uint64_t file_size = static_cast<uint64_t>(end);

  static const unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  unsigned char prefix[12];
  if (file_size < 10) fail(path, "is not a .npy file (only " + std::to_string(file_size) + " bytes)");
  in.read(reinterpret_cast<char*>(prefix), 10);
  if (!in) fail(path, "could not be read (error in the .npy preamble)");
  if (std::memcmp(prefix, kMagic, 6) != 0) fail(path, "is not a .npy file (bad magic string)");
  const int major = prefix[6], minor = prefix[7];
  if (!((major == 1 || major == 2 || major == 3) && minor == 0))
    fail(path, "has an unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + " (supported: 1.0, 2.0, 3.0)");
  uint64_t preamble = 10, header_len = 0;
  if (major == 1) {
    header_len = read_le(prefix + 8, 2);
  } else {
    if (file_size < 12) fail(path, "is truncated inside the .npy preamble");
    in.read(reinterpret_cast<char*>(prefix + 10), 2);
    if (!in) fail(path, "could not be read (error in the .npy preamble)");
    header_len = read_le(prefix + 8, 4);
    preamble = 12;
  }
  if (header_len > file_size - preamble)
    fail(path, "is truncated or corrupt: its header length " + std::to_string(header_len) +
                   " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  std::string header(static_cast<size_t>(header_len), '\0');
  if (header_len > 0) {
    in.read(&header[0], static_cast<std::streamsize>(header_len));
    if (!in) fail(path, "could not be read (error in the .npy header)");
  }
  for (unsigned char c : header)
    if (c == 0 || c >= 0x80) fail(path, "has a malformed .npy header (non-ASCII byte)");

  const NpyHeader h = npy_parse_header(header, path);
  NpyArray a;
  bool big_endian = false;
  parse_descr(h.descr, path, &a.dtype, &big_endian);
  if (h.fortran_order)
    fail(path, "is stored in Fortran order (fortran_order: True); expanse reads only C-order arrays "
               "(save np.ascontiguousarray(a))");
  a.shape = h.shape;
  const size_t elem = dtype_bytes(a.dtype);
  const int64_t n = checked_numel(a.shape, "file " + path, elem);
  const uint64_t expected = static_cast<uint64_t>(n) * elem;
  const uint64_t found = file_size - preamble - header_len;
  if (found < expected)
    fail(path, "is truncated: expected " + std::to_string(expected) + " bytes of data, found " +
                   std::to_string(found));
  if (found > expected)
    fail(path, "has " + std::to_string(found - expected) +
                   " unexpected bytes after the data (expected " + std::to_string(expected) +
                   " bytes of data for its shape)");
  a.data.resize(static_cast<size_t>(expected));
  if (expected > 0) {
    in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(expected));
    if (!in || static_cast<uint64_t>(in.gcount()) != expected)
      fail(path, "could not be read (" + std::to_string(in.gcount()) + " of " +
                     std::to_string(expected) + " bytes of data read)");
  }
  if (big_endian == host_is_little_endian()) byteswap_elements(a.data.data(), static_cast<size_t>(n), elem);
  return a;
}

// ---------------------------------------------------------------- writing

void npy_write(const std::string& path, expanse_dtype dtype, const std::vector<int64_t>& shape,
               const void* data) {
  if (shape.size() > EXPANSE_MAX_DIMS)
    fail(path, "cannot be written: rank " + std::to_string(shape.size()) + " is above " + std::to_string(EXPANSE_MAX_DIMS));
  const size_t in_elem = dtype_bytes(dtype);
  if (in_elem == 0) fail(path, "cannot be written: unknown dtype " + std::to_string(static_cast<int>(dtype)));
  const int64_t n = checked_numel(shape, "file " + path, 8);

  // bfloat16 -> float32 (exact); numpy has no bfloat16.
  std::vector<unsigned char> widened;
  const void* payload = data;
  expanse_dtype file_dtype = dtype;
  if (dtype == EXPANSE_BF16) {
    widened.resize(static_cast<size_t>(n) * 4);
    convert_elements(data, EXPANSE_BF16, widened.data(), EXPANSE_F32, static_cast<size_t>(n));
    payload = widened.data();
    file_dtype = EXPANSE_F32;
  }
  const size_t elem = dtype_bytes(file_dtype);
  const bool little = host_is_little_endian();
  const char order = little ? '<' : '>';
  const char* size_code = file_dtype == EXPANSE_F16 ? "2" : file_dtype == EXPANSE_F32 ? "4" : "8";

  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_text += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) shape_text += ",";
  shape_text += ")";
  std::string dict = std::string("{'descr': '") + order + "f" + size_code +
                     "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // Pad with spaces so that preamble + header is a multiple of 64 and the header ends in '\n'.
  const size_t preamble = 10;
  size_t total = preamble + dict.size() + 1;
  const size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';
  if (dict.size() > 65535) fail(path, "cannot be written: header too long for format version 1.0");

  // Only a missing path or a regular file is written: opening a FIFO for writing would block.
  struct stat st{};
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(path, std::string("cannot be written: it exists and is not a regular file (") + file_kind(st.st_mode) + ")");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, std::string("cannot be opened for writing: ") + std::strerror(errno));
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                           static_cast<unsigned char>(dict.size() & 0xff),
                           static_cast<unsigned char>(dict.size() >> 8)};
  out.write(reinterpret_cast<const char*>(pre), sizeof pre);
  out.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  const size_t bytes = static_cast<size_t>(n) * elem;
  if (bytes > 0) {
    if (payload == nullptr) fail(path, "cannot be written: no data");
    out.write(static_cast<const char*>(payload), static_cast<std::streamsize>(bytes));
  }
  out.flush();
  if (!out) fail(path, std::string("could not be written: ") + std::strerror(errno));
  out.close();
  if (out.fail()) fail(path, std::string("could not be written (on close): ") + std::strerror(errno));
}

}  // namespace expanse_cli
