#include "dispatch.hpp"

#include <stdexcept>

namespace expanse_cuda {

expanse_sdk::implementation_lists& cuda_lists() {
  static expanse_sdk::implementation_lists lists;
  return lists;
}

const expanse_sdk::dispatcher& cuda_dispatcher() {
  static const expanse_sdk::dispatcher dispatcher("cuda", cuda_lists());
  return dispatcher;
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace expanse_cuda
