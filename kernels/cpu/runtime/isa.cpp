#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if GGML_EXT_X86_VARIANTS
#include <cpuid.h>
#endif

namespace ggml_ext::cpu {

#if GGML_EXT_X86_VARIANTS
namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c" (clang 14). The AVX2
// test beside it covers the operating system's support of the vector registers.
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 29) & 1u);
}
}  // namespace
#endif

Isa best_supported_isa() {
#if GGML_EXT_X86_VARIANTS
  __builtin_cpu_init();
  if (GGML_EXT_AVX512_VARIANT && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
      __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi2")) {
    return Isa::avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      has_f16c() && __builtin_cpu_supports("bmi2")) {
    return Isa::avx2;
  }
#endif
  return Isa::base;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default:
#if defined(__aarch64__) || defined(_M_ARM64)
      return "neon";
#else
      return "base";
#endif
  }
}

namespace {
Isa initial_isa() {
  const Isa best = best_supported_isa();
  const char* env = std::getenv("MLX_GGML_EXT_ISA");
  if (env == nullptr) return best;
  for (Isa isa : {Isa::base, Isa::avx2, Isa::avx512}) {
    if (std::strcmp(env, isa_name(isa)) == 0 && static_cast<int>(isa) <= static_cast<int>(best)) {
      return isa;
    }
  }
  return best;
}

std::atomic<int>& isa_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}
}  // namespace

Isa active_isa() { return static_cast<Isa>(isa_slot().load(std::memory_order_relaxed)); }

bool set_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(best_supported_isa())) return false;
  isa_slot().store(static_cast<int>(isa));
  return true;
}

}  // namespace ggml_ext::cpu
