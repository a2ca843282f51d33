#include "dispatch.hpp"

namespace expanse_cuda {

expanse_sdk::implementation_lists& cuda_lists() {
  static expanse_sdk::implementation_lists lists;
  return lists;
}

const expanse_sdk::dispatcher& cuda_dispatcher() {
  static const expanse_sdk::dispatcher dispatcher("cuda", cuda_lists());
  return dispatcher;
}

}  // namespace expanse_cuda
