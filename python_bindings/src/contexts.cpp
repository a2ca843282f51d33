#include "contexts.hpp"

#include <map>
#include <memory>
#include <utility>

#include "errors.hpp"

namespace expanse_py {
namespace {

struct context_deleter {
  void operator()(expanse_context* ctx) const { expanse_context_destroy(ctx); }
};
using context_ptr = std::unique_ptr<expanse_context, context_deleter>;

}  // namespace

expanse_context* context_for(const std::string& backend, int32_t device) {
  thread_local std::map<std::pair<std::string, int32_t>, context_ptr> cache;
  auto key = std::make_pair(backend, device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  expanse_context* ctx = nullptr;
  check(expanse_context_create(backend.c_str(), device, &ctx));
  return cache.emplace(key, context_ptr(ctx)).first->second.get();
}

}  // namespace expanse_py
