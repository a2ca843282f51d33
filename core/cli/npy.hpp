// NumPy .npy files for the `expanse` command, and dtype conversions of host buffers.
//
// Reading accepts format versions 1.0, 2.0 and 3.0, dtypes float16/float32/float64 ('<f2', '<f4',
// '<f8'; big-endian '>f*' is byte-swapped), C order only, rank 0 to EXPANSE_MAX_DIMS. Everything is
// validated (magic string, header length, header dictionary, shape, data size) and every error is a
// std::runtime_error whose text names the file. Writing produces version 1.0 files whose header is
// padded to a multiple of 64 bytes, as numpy does.
//
// This file depends only on expanse.h's enums, not on libexpanse.so.
#ifndef EXPANSE_CLI_NPY_HPP
#define EXPANSE_CLI_NPY_HPP

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "expanse/expanse.h"

namespace expanse_cli {

// A dense C-order array in host memory, elements in host byte order.
struct NpyArray {
  expanse_dtype dtype = EXPANSE_F32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;  // numel() * dtype_bytes(dtype) bytes

  int64_t numel() const;
};

// The parsed header dictionary of a .npy file.
struct NpyHeader {
  std::string descr;  // e.g. "<f4"
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Throws std::runtime_error naming `path` unless it is a regular file: open() on a FIFO or a device
// can block forever, and a path that cannot be examined gets the system's reason (a symbolic link
// loop is not "missing").
void require_regular_file(const std::string& path);

// Reads a .npy file (a regular file only). Throws std::runtime_error naming `path` on any problem.
NpyArray npy_read(const std::string& path);

// Writes `data` (numel(shape) elements of `dtype`, C order, host byte order) as a version 1.0 .npy,
// replacing a regular file of that name but nothing else (a FIFO would block the write).
// numpy has no bfloat16: EXPANSE_BF16 data is written widened (exactly) to float32 ('<f4').
void npy_write(const std::string& path, expanse_dtype dtype, const std::vector<int64_t>& shape,
               const void* data);
inline void npy_write(const std::string& path, const NpyArray& a) {
  npy_write(path, a.dtype, a.shape, a.data.data());
}

// Parses the header dictionary text ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }").
// `file` is used in error texts. Exposed for tests.
NpyHeader npy_parse_header(const std::string& text, const std::string& file);

// ---------------------------------------------------------------- dtypes and conversions

// Element size in bytes (0 for an unknown dtype).
size_t dtype_bytes(expanse_dtype dtype);

// Number of elements of a shape; throws std::runtime_error mentioning `what` when a dimension is
// negative or the product (times `elem_bytes`, when nonzero) overflows int64_t or size_t.
int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what,
                      size_t elem_bytes = 0);

// f16/bf16 conversions: expanse::harness::double_to_f16 and friends (cases.hpp).

// Element `index` of a buffer of `dtype`, as double (exact for every dtype).
double load_as_double(const void* data, expanse_dtype dtype, size_t index);
// Stores v, rounded to nearest-even, into element `index` of a buffer of `dtype`.
void store_from_double(void* data, expanse_dtype dtype, size_t index, double v);

// Converts `count` elements (src and dst must not overlap unless the dtypes are equal).
void convert_elements(const void* src, expanse_dtype src_dtype, void* dst, expanse_dtype dst_dtype,
                      size_t count);
// Returns a copy of `a` converted to `dtype` (a itself when the dtype is already `dtype`).
NpyArray convert_array(const NpyArray& a, expanse_dtype dtype);

}  // namespace expanse_cli

#endif  // EXPANSE_CLI_NPY_HPP
