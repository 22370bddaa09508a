#include "kernels/cpu/stream.h"

#include <atomic>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {

constexpr int64_t kLineFloats = 16;  // one 64-byte cache line
constexpr int64_t kGrainLines = 1024;

void stream_copy(const StreamArgs& a) {
  const float* src = static_cast<const float*>(a.src);
  float* dst = static_cast<float*>(a.dst);
  parallel_for(a.bytes / 64, kGrainLines, [&](int64_t b, int64_t e) {
    for (int64_t i = b * kLineFloats; i < e * kLineFloats; i += kLanes) {
      F32::store(dst + i, F32::load(src + i));
    }
  });
}

// The same copy with cache-bypassing stores where the variant has them: on most x86
// parts the fastest way to stream a large output, so kernels that use such stores
// are judged against it.
void stream_copy_nt(const StreamArgs& a) {
  const float* src = static_cast<const float*>(a.src);
  float* dst = static_cast<float*>(a.dst);
  if (!stream_aligned(dst, sizeof(vf32))) return GGML_EXT_ISA::stream_copy(a);
  parallel_for(a.bytes / 64, kGrainLines, [&](int64_t b, int64_t e) {
    for (int64_t i = b * kLineFloats; i < e * kLineFloats; i += kLanes) {
      stream_store(dst + i, F32::load(src + i));
    }
    stream_fence();
  });
}

void stream_read(const StreamArgs& a) {
  const float* src = static_cast<const float*>(a.src);
  std::atomic<float> total{0.0f};
  parallel_for(a.bytes / 64, kGrainLines, [&](int64_t b, int64_t e) {
    vf32 s0 = {}, s1 = {};
    int64_t i = b * kLineFloats;
    const int64_t end = e * kLineFloats;
    for (; i + 2 * kLanes <= end; i += 2 * kLanes) {
      s0 += F32::load(src + i);
      s1 += F32::load(src + i + kLanes);
    }
    for (; i < end; i += kLanes) s0 += F32::load(src + i);
    float part = hsum(s0 + s1), seen = total.load();
    while (!total.compare_exchange_weak(seen, seen + part)) {
    }
  });
  *a.result = total.load();
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(stream_copy, StreamArgs)
GGML_EXT_DISPATCH(stream_copy_nt, StreamArgs)
GGML_EXT_DISPATCH(stream_read, StreamArgs)

}  // namespace ggml_ext::cpu
