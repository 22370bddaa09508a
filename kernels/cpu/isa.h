// Instruction-set variants of the CPU kernels.
//
// Each kernels/cpu/*.cpp is compiled once per variant (see
// cmake/cpu_variants.cmake) with GGML_EXT_ISA naming the variant's namespace.
// A kernel is written once as `namespace GGML_EXT_ISA { void f(const Args&); }`
// and its file ends with GGML_EXT_DISPATCH(f, Args), which only the baseline
// build expands into the public ggml_ext::cpu::f that picks a variant at run time.
#pragma once
#include <cstdint>

namespace ggml_ext::cpu {

enum class Isa : int { base = 0, avx2 = 1, avx512 = 2 };

// The variant in use: the best the CPU supports, or MLX_GGML_EXT_ISA=base|avx2|avx512,
// or what set_isa chose (tests run every variant this way).
Isa active_isa();
Isa best_supported_isa();
// Returns false (and changes nothing) if the CPU cannot run `isa`.
bool set_isa(Isa isa);
const char* isa_name(Isa isa);

}  // namespace ggml_ext::cpu

// x86 builds have an AVX-512 variant unless cmake/cpu_variants.cmake says otherwise (clang).
#if GGML_EXT_X86_VARIANTS && !defined(GGML_EXT_AVX512_VARIANT)
#define GGML_EXT_AVX512_VARIANT 1
#endif

#if GGML_EXT_X86_VARIANTS && GGML_EXT_AVX512_VARIANT
#define GGML_EXT_DISPATCH_IMPL(fn, Args)                                  \
  namespace isa_avx512 { void fn(const Args&); }                          \
  namespace isa_avx2 { void fn(const Args&); }                            \
  namespace isa_base { void fn(const Args&); }                            \
  void fn(const Args& args) {                                             \
    switch (active_isa()) {                                               \
      case Isa::avx512: return isa_avx512::fn(args);                      \
      case Isa::avx2: return isa_avx2::fn(args);                          \
      default: return isa_base::fn(args);                                 \
    }                                                                     \
  }
#elif GGML_EXT_X86_VARIANTS  // built without the AVX-512 variant (cmake/cpu_variants.cmake): never active
#define GGML_EXT_DISPATCH_IMPL(fn, Args)                                  \
  namespace isa_avx2 { void fn(const Args&); }                            \
  namespace isa_base { void fn(const Args&); }                            \
  void fn(const Args& args) {                                             \
    if (active_isa() == Isa::avx2) return isa_avx2::fn(args);             \
    return isa_base::fn(args);                                            \
  }
#else
#define GGML_EXT_DISPATCH_IMPL(fn, Args) \
  namespace isa_base { void fn(const Args&); } \
  void fn(const Args& args) { isa_base::fn(args); }
#endif

#ifdef GGML_EXT_ISA_DISPATCH
#define GGML_EXT_DISPATCH(fn, Args) GGML_EXT_DISPATCH_IMPL(fn, Args)
#else
#define GGML_EXT_DISPATCH(fn, Args)
#endif
