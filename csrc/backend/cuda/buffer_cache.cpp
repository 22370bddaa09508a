#include "csrc/backend/cuda/buffer_cache.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace mlx_ggml_ext::cuda {
namespace {

// Size classes: powers of two up to 64 KiB (small outputs of many shapes share a few classes), then whole
// 64 KiB granules (at most 1/64 of a large buffer wasted). Decode and prefill repeat the same shapes token
// after token, so exact classes hit.
constexpr size_t kSmallLimit = size_t(64) << 10;
constexpr size_t kGranule = size_t(64) << 10;

struct Cache {
  std::mutex mutex;
  // (device, class bytes) -> free buffers of that class.
  std::unordered_map<unsigned long long, std::vector<void*>> free;
  size_t bytes = 0;
};

// Never destroyed: buffers may come back at interpreter exit, after static destructors would have run.
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

unsigned long long key(int device, size_t class_bytes) {
  return (static_cast<unsigned long long>(static_cast<unsigned>(device)) << 48) ^ class_bytes;
}

}  // namespace

size_t buffer_cache_limit() {
  static const size_t limit = [] {
    const char* v = std::getenv("MLX_GGML_EXT_CUDA_CACHE_MB");
    if (!v || !*v) return size_t(256) << 20;
    char* end = nullptr;
    const long long mb = std::strtoll(v, &end, 10);
    if (*end != '\0' || mb < 0 || mb > (1LL << 30)) {
      throw std::invalid_argument(std::string("[mlx_ggml_ext] MLX_GGML_EXT_CUDA_CACHE_MB must be a number of "
                                              "megabytes >= 0, got '") + v + "'.");
    }
    return static_cast<size_t>(mb) << 20;
  }();
  return limit;
}

size_t cache_class_bytes(size_t bytes) {
  if (bytes <= kSmallLimit) {
    size_t c = 256;
    while (c < bytes) c <<= 1;
    return c;
  }
  return (bytes + kGranule - 1) / kGranule * kGranule;
}

void* cached_buffer(int device, size_t bytes) {
  if (buffer_cache_limit() == 0) return nullptr;
  Cache& c = cache();
  const size_t class_bytes = cache_class_bytes(bytes);
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.free.find(key(device, class_bytes));
  if (it == c.free.end() || it->second.empty()) return nullptr;
  void* data = it->second.back();
  it->second.pop_back();
  c.bytes -= class_bytes;
  return data;
}

bool cache_release(int device, void* data, size_t bytes) {
  const size_t limit = buffer_cache_limit();
  if (limit == 0) return false;
  Cache& c = cache();
  const size_t class_bytes = cache_class_bytes(bytes);
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.bytes + class_bytes > limit) return false;
  c.free[key(device, class_bytes)].push_back(data);
  c.bytes += class_bytes;
  return true;
}

size_t clear_buffer_cache() {
  Cache& c = cache();
  std::unordered_map<unsigned long long, std::vector<void*>> taken;
  size_t freed = 0;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    taken.swap(c.free);
    freed = c.bytes;
    c.bytes = 0;
  }
  // cudaFree waits for the device: the buffers are unused, and this runs only when memory ran out.
  for (auto& [k, buffers] : taken) {
    for (void* data : buffers) cudaFree(data);
  }
  return freed;
}

}  // namespace mlx_ggml_ext::cuda
