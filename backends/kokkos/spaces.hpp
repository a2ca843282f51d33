// The execution spaces the Kokkos backend serves, one expanse device each, chosen from those the
// Kokkos build enables. A backend serves one kind of memory (backend.h: device_type), so:
//   a Kokkos with its Cuda space:  the Cuda space, on CUDA device pointers (PyTorch's CUDA tensors);
//   with its HIP space:            the HIP space, on ROCm device pointers;
//   otherwise:                     the host spaces (OpenMP, Threads, Serial, in that order), on host
//                                  pointers.
// Kernels take the space as a template parameter (never assume Serial); with_space() turns a device
// index into that type.
#pragma once

#include <Kokkos_Core.hpp>

#include <stdexcept>
#include <utility>

#include "expanse/expanse.h"

namespace expanse_kokkos {

template <class... Spaces>
struct space_list {
  static constexpr int count = sizeof...(Spaces);
};

#if defined(KOKKOS_ENABLE_CUDA)
using served_spaces = space_list<Kokkos::Cuda>;
constexpr int32_t kDeviceType = EXPANSE_DEVICE_CUDA;
#elif defined(KOKKOS_ENABLE_HIP) && KOKKOS_VERSION >= 40000
using served_spaces = space_list<Kokkos::HIP>;  // out of Experimental since Kokkos 4.0
constexpr int32_t kDeviceType = EXPANSE_DEVICE_ROCM;
#elif defined(KOKKOS_ENABLE_HIP)
using served_spaces = space_list<Kokkos::Experimental::HIP>;
constexpr int32_t kDeviceType = EXPANSE_DEVICE_ROCM;
#else
template <class... Spaces>
using host_list = space_list<Spaces...>;
using served_spaces = host_list<
#if defined(KOKKOS_ENABLE_OPENMP)
    Kokkos::OpenMP,
#endif
#if defined(KOKKOS_ENABLE_THREADS)
    Kokkos::Threads,
#endif
#if defined(KOKKOS_ENABLE_SERIAL)
    Kokkos::Serial,
#endif
    void>;  // the list's end (not a space)
constexpr int32_t kDeviceType = EXPANSE_DEVICE_CPU;
#endif

namespace detail {
template <class F, class Space, class... Rest>
void with_space_at(int index, F&& f, space_list<Space, Rest...>) {
  if constexpr (std::is_void_v<Space>) {
    throw std::out_of_range("kokkos: no execution space at this device index");
  } else if (index == 0) {
    f(Space{});
  } else if constexpr (sizeof...(Rest) > 0) {
    with_space_at(index - 1, std::forward<F>(f), space_list<Rest...>{});
  } else {
    throw std::out_of_range("kokkos: no execution space at this device index");
  }
}
template <class F>
void with_space_at(int, F&&, space_list<>) {
  throw std::out_of_range("kokkos: no execution space at this device index");
}
template <class... S>
constexpr int real_count(space_list<S...>) {
  return ((std::is_void_v<S> ? 0 : 1) + ... + 0);
}
}  // namespace detail

// The number of devices (served execution spaces).
constexpr int kSpaceCount = detail::real_count(served_spaces{});

// Calls f(Space{}) for the execution space of device `index`.
template <class F>
void with_space(int index, F&& f) {
  detail::with_space_at(index, std::forward<F>(f), served_spaces{});
}

// The instance of Space that runs on the caller's stream: a CUDA or HIP stream where the space has
// streams, the default instance otherwise (host spaces run each kernel to completion).
template <class Space>
Space instance_for(void* stream) {
  // A Cuda or HIP build serves its device space alone (served_spaces), which takes the stream.
#if defined(KOKKOS_ENABLE_CUDA)
  if (stream != nullptr) return Space(static_cast<cudaStream_t>(stream));
#elif defined(KOKKOS_ENABLE_HIP)
  if (stream != nullptr) return Space(static_cast<hipStream_t>(stream));
#endif
  (void)stream;
  return Space{};
}

}  // namespace expanse_kokkos
