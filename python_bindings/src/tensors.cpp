#include "tensors.hpp"

#include <cstdint>

#include <nanobind/stl/string.h>

#include "errors.hpp"

namespace expanse_py {

namespace dl = nb::dlpack;

std::string dtype_name(dl::dtype t) {
  if (t.lanes != 1) return "";
  if (t.code == uint8_t(dl::dtype_code::Float)) {
    if (t.bits == 16) return "f16";
    if (t.bits == 32) return "f32";
    if (t.bits == 64) return "f64";
  }
  if (t.code == uint8_t(dl::dtype_code::Bfloat) && t.bits == 16) return "bf16";
  if (t.code == uint8_t(dl::dtype_code::UInt) && t.bits == 8) return "u8";
  return "";
}

dl::dtype dlpack_dtype(const std::string& name) {
  if (name == "f16") return dl::dtype{uint8_t(dl::dtype_code::Float), 16, 1};
  if (name == "bf16") return dl::dtype{uint8_t(dl::dtype_code::Bfloat), 16, 1};
  if (name == "f32") return dl::dtype{uint8_t(dl::dtype_code::Float), 32, 1};
  if (name == "f64") return dl::dtype{uint8_t(dl::dtype_code::Float), 64, 1};
  if (name == "u8") return dl::dtype{uint8_t(dl::dtype_code::UInt), 8, 1};
  throw nb::value_error(("unknown dtype '" + name + "' (expected f16, bf16, f32, f64 or u8)").c_str());
}

expanse_dtype expanse_dtype_of(const std::string& name) {
  if (name == "f16") return EXPANSE_F16;
  if (name == "bf16") return EXPANSE_BF16;
  if (name == "f32") return EXPANSE_F32;
  if (name == "f64") return EXPANSE_F64;
  throw nb::value_error(("unknown tensor dtype '" + name + "' (expected f16, bf16, f32 or f64)").c_str());
}

namespace {

std::string describe_dtype(dl::dtype t) {
  const char* kind = "?";
  switch (dl::dtype_code(t.code)) {
    case dl::dtype_code::Int: kind = "int"; break;
    case dl::dtype_code::UInt: kind = "uint"; break;
    case dl::dtype_code::Float: kind = "float"; break;
    case dl::dtype_code::Bfloat: kind = "bfloat"; break;
    case dl::dtype_code::Complex: kind = "complex"; break;
    case dl::dtype_code::Bool: kind = "bool"; break;
    default: break;
  }
  return std::string(kind) + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

template <class Array>
expanse_tensor tensor_of(const std::string& name, const Array& a) {
  const std::string dtype = dtype_name(a.dtype());
  if (dtype.empty() || dtype == "u8")
    raise_type_error("argument '" + name + "' has dtype " + describe_dtype(a.dtype()) +
                     "; expanse takes float16, bfloat16, float32 or float64 arrays");
  if (a.ndim() > EXPANSE_MAX_DIMS)
    raise_status(EXPANSE_ERROR_INVALID_ARGUMENT, "argument '" + name + "' has " + std::to_string(a.ndim()) +
                                                     " dimensions; at most " + std::to_string(EXPANSE_MAX_DIMS) +
                                                     " are supported");
  expanse_tensor t{};
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = expanse_dtype_of(dtype);
  t.device_type = a.device_type();
  t.device_id = a.device_id();
  t.ndim = static_cast<int32_t>(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = a.shape(i);
    t.strides[i] = a.stride(i);
  }
  return t;
}

[[noreturn]] void not_an_array(const std::string& name, nb::handle obj, bool writable) {
  std::string type = nb::borrow<nb::str>(nb::type_name(obj.type())).c_str();
  if (writable)
    raise_type_error("argument '" + name + "' must be a writable array (numpy.ndarray or a DLPack tensor), got " +
                     type + " (a read-only array cannot receive results)");
  raise_type_error("argument '" + name + "' must be an array (numpy.ndarray, or a DLPack tensor such as "
                   "torch.Tensor, cupy.ndarray or jax.Array), got " + type);
}

}  // namespace

expanse_tensor array_keeper::view(const std::string& name, nb::handle obj, bool writable) {
  // convert=false: nanobind must hand over the producer's own memory, never a converted copy.
  if (writable) {
    nb::ndarray<> a;
    if (!nb::try_cast(obj, a, /*convert=*/false)) not_an_array(name, obj, true);
    outputs_.push_back(a);
    return tensor_of(name, a);
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) not_an_array(name, obj, false);
  inputs_.push_back(a);
  return tensor_of(name, a);
}

array_keeper::raw array_keeper::bytes_of(const std::string& name, nb::handle obj, bool writable) {
  auto fill = [&](const auto& a) {
    raw r{};
    r.data = const_cast<void*>(static_cast<const void*>(a.data()));
    r.bytes = a.nbytes();
    r.device_type = a.device_type();
    r.device_id = a.device_id();
    int64_t expected = 1;
    r.contiguous = true;
    for (size_t i = a.ndim(); i-- > 0;) {
      if (a.shape(i) != 1 && a.stride(i) != expected) r.contiguous = false;
      expected *= a.shape(i);
    }
    return r;
  };
  if (writable) {
    nb::ndarray<> a;
    if (!nb::try_cast(obj, a, false)) not_an_array(name, obj, true);
    outputs_.push_back(a);
    return fill(a);
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, false)) not_an_array(name, obj, false);
  inputs_.push_back(a);
  return fill(a);
}

nb::dict describe_tensor(const expanse_tensor& t) {
  nb::dict d;
  nb::list shape, strides;
  for (int i = 0; i < t.ndim; ++i) {
    shape.append(t.shape[i]);
    strides.append(t.strides[i]);
  }
  d["data_ptr"] = reinterpret_cast<uintptr_t>(t.data);
  d["dtype"] = expanse_dtype_name(expanse_dtype(t.dtype));
  d["device_type"] = t.device_type;
  d["device_id"] = t.device_id;
  d["shape"] = nb::tuple(shape);
  d["strides"] = nb::tuple(strides);
  return d;
}

namespace {

// describe(array) -> dict: how expanse sees an array (without copying it).
nb::dict describe(nb::handle obj) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, false)) not_an_array("array", obj, false);
  nb::dict d;
  nb::list shape, strides;
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape.append(a.shape(i));
    strides.append(a.stride(i));
  }
  const std::string dtype = dtype_name(a.dtype());
  d["data_ptr"] = reinterpret_cast<uintptr_t>(a.data());
  d["dtype"] = dtype.empty() ? describe_dtype(a.dtype()) : dtype;
  d["supported"] = !dtype.empty() && dtype != "u8";
  d["device_type"] = a.device_type();
  d["device_id"] = a.device_id();
  d["shape"] = nb::tuple(shape);
  d["strides"] = nb::tuple(strides);
  return d;
}

}  // namespace

void bind_tensors(nb::module_& m) {
  m.def("describe", &describe, nb::arg("array"),
        "How expanse reads an array, without copying it: dict with data_ptr, dtype, device_type "
        "(DLPack code), device_id, shape and strides (in elements).");
}

}  // namespace expanse_py
