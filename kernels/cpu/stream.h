// Streaming kernels that measure the memory roofline the other kernels are
// judged against: same thread pool, same SIMD width.
#pragma once
#include <cstdint>

namespace ggml_ext::cpu {

struct StreamArgs {
  const void* src;
  void* dst;       // copy: destination; read: unused
  int64_t bytes;   // a multiple of 64
  float* result;   // read: a checksum so the loads cannot be optimized away
};

void stream_copy(const StreamArgs& args);
void stream_copy_nt(const StreamArgs& args);  // cache-bypassing stores where available
void stream_read(const StreamArgs& args);

}  // namespace ggml_ext::cpu
