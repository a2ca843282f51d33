// Framework arrays as expanse_tensor views, without copies: numpy arrays and any DLPack producer
// (PyTorch, CuPy, JAX, ...) are read through nanobind's nb::ndarray, which keeps the producer's
// memory alive and reports its data pointer, dtype, device and strides (in elements, as the C ABI
// wants them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "expanse/expanse.h"

namespace expanse_py {

namespace nb = nanobind;

// The library's dtype name ("f16", "bf16", "f32", "f64") of a DLPack dtype, "u8" for bytes (the
// workspace), or "" when the library has no code for it.
std::string dtype_name(nb::dlpack::dtype dtype);
// The DLPack dtype of a name accepted by dtype_name(); throws ValueError for another name.
nb::dlpack::dtype dlpack_dtype(const std::string& name);
expanse_dtype expanse_dtype_of(const std::string& name);

// Holds the imported arrays of one call so that their memory outlives the run.
class array_keeper {
 public:
  // Reads `obj` as an array: writable ones for outputs and in-place states, read-only allowed for
  // inputs. Throws TypeError naming `name` when obj is no array (or a read-only one where a
  // writable one is needed). Never copies.
  expanse_tensor view(const std::string& name, nb::handle obj, bool writable);
  // The raw memory of obj (any dtype): pointer, byte size, device; for workspaces and copies.
  struct raw {
    void* data;
    size_t bytes;
    int32_t device_type, device_id;
    bool contiguous;
  };
  raw bytes_of(const std::string& name, nb::handle obj, bool writable);

 private:
  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
};

// (shape, strides, dtype, device, data pointer) of an array, for describe() and last_call().
nb::dict describe_tensor(const expanse_tensor& t);

void bind_tensors(nb::module_& m);

}  // namespace expanse_py
