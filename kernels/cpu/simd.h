// A float vector of the variant's natural width (16 lanes AVX-512, 8 AVX2,
// 4 on NEON and the SSE2/generic baseline), written with GCC/Clang vector
// extensions so the same kernel source compiles for every target, plus loads and
// stores that convert float16/bfloat16 with the hardware instruction when present.
// Everything here lives in the variant's namespace, so no inline function compiled
// with AVX-512 flags can be picked by the linker for the baseline build.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON) || defined(__ARM_NEON__)
#include <arm_neon.h>
#endif

#include "kernels/common/fp16.h"
#include "kernels/cpu/isa.h"

#ifndef GGML_EXT_ISA
#error "kernels/cpu sources are compiled through cmake/cpu_variants.cmake"
#endif

namespace ggml_ext::cpu::GGML_EXT_ISA {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif

typedef float vf32 __attribute__((vector_size(kLanes * 4)));
typedef uint32_t vu32 __attribute__((vector_size(kLanes * 4)));
typedef uint16_t vu16 __attribute__((vector_size(kLanes * 2)));

inline vf32 splat(float v) { return vf32{} + v; }

// Stores that bypass the cache (no read-for-ownership of the destination line) for
// outputs too large to stay cached anyway. `p` must be aligned to the vector's width
// (callers check with stream_aligned); the portable build stores normally.
constexpr bool kHasStreamingStores =
#if defined(__AVX512F__) || defined(__AVX2__)
    true;
#else
    false;
#endif

inline bool stream_aligned(const void* p, int bytes) {
  return kHasStreamingStores && reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Elements of T before p + k reaches a multiple of a kLanes-element vector of T
// (MLX's CPU buffers are only 8-byte aligned); n if it never does within n.
template <class T>
inline int64_t elements_to_vector_alignment(const T* p, int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), width = kLanes * sizeof(T);
  if (a % sizeof(T)) return n;
  const int64_t k = static_cast<int64_t>((width - a % width) % width / sizeof(T));
  return k < n ? k : n;
}

// Outputs at least this large are written with streaming stores: they would
// leave the cache before anyone reads them, and skipping the read-for-ownership
// saves a third of the memory traffic of a streaming kernel.
constexpr int64_t kStreamingStoreMinBytes = int64_t(4) << 20;

template <class V>
inline void stream_store(void* p, V v) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    _mm512_stream_si512(static_cast<__m512i*>(p), (__m512i)v);
    return;
  }
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
  if constexpr (sizeof(V) == 32) {
    _mm256_stream_si256(static_cast<__m256i*>(p), (__m256i)v);
    return;
  }
  if constexpr (sizeof(V) == 16) {
    _mm_stream_si128(static_cast<__m128i*>(p), (__m128i)v);
    return;
  }
#endif
  std::memcpy(p, &v, sizeof v);
}

// Copies n bytes to dst with streaming stores for the aligned middle (ordinary
// stores for the unaligned head and tail): for kernels that build an output row in
// a cached scratch buffer and then stream it out.
inline void stream_copy_bytes(void* dst, const void* src, int64_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  constexpr int64_t kWidth = sizeof(vf32);
  int64_t head = static_cast<int64_t>((kWidth - reinterpret_cast<uintptr_t>(d) % kWidth) % kWidth);
  if (!kHasStreamingStores || head > n) head = n;
  std::memcpy(d, s, head);
  int64_t i = head;
  for (; i + kWidth <= n; i += kWidth) {
    vf32 v;
    std::memcpy(&v, s + i, sizeof v);
    stream_store(d + i, v);
  }
  std::memcpy(d + i, s + i, n - i);
}

#if defined(__AVX512F__) || defined(__AVX2__)
// Lanes [shift, kLanes) of a, then lanes [0, shift) of b (the vector that starts
// `shift` lanes into a), with the shift chosen at run time.
class LaneShift {
 public:
  explicit LaneShift(int shift) {
    for (int l = 0; l < kLanes; ++l) index_[l] = shift + l;
  }
  vf32 operator()(vf32 a, vf32 b) const {
#if defined(__AVX512F__)
    return (vf32)_mm512_permutex2var_ps((__m512)a, (__m512i)index_, (__m512)b);
#else
    // Each permute reads the index's low 3 bits; lanes past 7 come from b.
    const __m256 from_a = _mm256_permutevar8x32_ps((__m256)a, (__m256i)index_);
    const __m256 from_b = _mm256_permutevar8x32_ps((__m256)b, (__m256i)index_);
    return (vf32)_mm256_blendv_ps(from_a, from_b, (__m256)(index_ >= kLanes));
#endif
  }

 private:
  typedef int32_t vi32 __attribute__((vector_size(kLanes * 4)));
  vi32 index_;
};

// Writes a float32 row of whole vectors, pushed in order, to a 4-byte aligned
// `dst` (MLX's buffers are only 8-byte aligned) with cache-bypassing stores: each
// aligned store joins the end of one pushed vector with the start of the next, so
// a kernel whose vectors are laid out from the row's start streams its output
// without a staging copy (staging a row in cache and streaming it out measured
// 1.4x slower for rope). The partial lines at both ends take ordinary stores.
class AlignedRowStream {
 public:
  explicit AlignedRowStream(float* dst)
      : dst_(dst), lead_(elements_to_vector_alignment(dst, kLanes)), join_(static_cast<int>(lead_)) {}

  void push(vf32 v) {
    if (pushed_ == 0) {
      for (int64_t l = 0; l < lead_; ++l) dst_[l] = v[l];
    } else {
      stream_store(dst_ + lead_ + (pushed_ - 1) * kLanes, join_(prev_, v));
    }
    prev_ = v;
    ++pushed_;
  }

  // Stores what the last push left: lanes [lead, kLanes) of the last vector.
  void finish() {
    if (pushed_ == 0) return;
    float* p = dst_ + lead_ + (pushed_ - 1) * kLanes;
    if (lead_ == 0) {
      stream_store(p, prev_);
      return;
    }
    for (int64_t l = lead_; l < kLanes; ++l) p[l - lead_] = prev_[l];
  }

 private:
  float* dst_;
  int64_t lead_;  // elements before dst's first vector boundary
  LaneShift join_;
  vf32 prev_{};
  int64_t pushed_ = 0;
};
#endif

// Whether AlignedRowStream can write to p.
inline bool stream_row_supported(const float* p) {
#if defined(__AVX512F__) || defined(__AVX2__)
  return reinterpret_cast<uintptr_t>(p) % sizeof(float) == 0;
#else
  (void)p;
  return false;
#endif
}

// Orders streaming stores before the stores of whoever reads the output next.
inline void stream_fence() {
#if defined(__AVX2__) || defined(__AVX512F__)
  _mm_sfence();
#endif
}

// Each lane rounded to the nearest integer, ties to even (nearbyint in the default rounding mode).
inline vf32 round_to_nearest_even(vf32 v) {
#if defined(__AVX512F__)
  return (vf32)_mm512_roundscale_ps((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX2__)
  return (vf32)_mm256_round_ps((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__aarch64__) && defined(__ARM_NEON)
  return (vf32)vrndnq_f32((float32x4_t)v);
#else
  for (int i = 0; i < kLanes; ++i) v[i] = __builtin_nearbyintf(v[i]);
  return v;
#endif
}

inline float hsum(vf32 v) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// Storage formats. Each has the element type in memory, a vector load/store that
// converts to/from float32, and the scalar forms for tails.
struct F32 {
  using T = float;
  static vf32 load(const float* p) {
    vf32 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, vf32 v) { std::memcpy(p, &v, sizeof v); }
  static void store_nt(float* p, vf32 v) { stream_store(p, v); }
  static float to_f32(float v) { return v; }
  static float from_f32(float v) { return v; }
};

// The 16-bit formats' stores, from the format's vector conversion `pack`.
template <class Fmt>
struct HalfStores {
  static void store(uint16_t* p, vf32 v) {
    const vu16 h = Fmt::pack(v);
    std::memcpy(p, &h, sizeof h);
  }
  static void store_nt(uint16_t* p, vf32 v) { stream_store(p, Fmt::pack(v)); }
};

struct BF16 : HalfStores<BF16> {
  using T = uint16_t;
  static vf32 load(const uint16_t* p) {
    vu16 h;
    std::memcpy(&h, p, sizeof h);
    return (vf32)(__builtin_convertvector(h, vu32) << 16);
  }
  static vu16 pack(vf32 v) {
    const vu32 u = (vu32)v;
    const vu32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu32 quiet_nan = (u >> 16) | 0x40u;
    const vu32 is_nan = (vu32)(v != v);  // all ones in NaN lanes
    return __builtin_convertvector((rounded & ~is_nan) | (quiet_nan & is_nan), vu16);
  }
  static float to_f32(uint16_t v) { return ggml_ext_bf16_to_fp32(v); }
  static uint16_t from_f32(float v) { return ggml_ext_fp32_to_bf16(v); }
};

struct F16 : HalfStores<F16> {
  using T = uint16_t;
  static vf32 load(const uint16_t* p) {
#if defined(__AVX512F__)
    return (vf32)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX2__) && defined(__F16C__)
    return (vf32)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__aarch64__) && defined(__ARM_NEON)
    return (vf32)vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
#else
    vf32 v;
    for (int i = 0; i < kLanes; ++i) v[i] = ggml_ext_fp16_to_fp32(p[i]);
    return v;
#endif
  }
  static vu16 pack(vf32 v) {
#if defined(__AVX512F__)
    return (vu16)_mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX2__) && defined(__F16C__)
    return (vu16)_mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__aarch64__) && defined(__ARM_NEON)
    return (vu16)vreinterpret_u16_f16(vcvt_f16_f32((float32x4_t)v));
#else
    vu16 h;
    for (int i = 0; i < kLanes; ++i) h[i] = ggml_ext_fp32_to_fp16(v[i]);
    return h;
#endif
  }
  static float to_f32(uint16_t v) { return ggml_ext_fp16_to_fp32(v); }
  static uint16_t from_f32(float v) { return ggml_ext_fp32_to_fp16(v); }
};

}  // namespace ggml_ext::cpu::GGML_EXT_ISA
