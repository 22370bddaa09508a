// Argument types shared by the CPU kernels and their MLX glue (no MLX here).
#pragma once
#include <cstdint>

namespace ggml_ext::cpu {

// The float formats the kernels read and write.
enum class FloatType : int { f32 = 0, f16 = 1, bf16 = 2 };

inline int64_t float_type_bytes(FloatType t) { return t == FloatType::f32 ? 4 : 2; }

}  // namespace ggml_ext::cpu

// Calls body with `Fmt` bound to the storage struct (F32/F16/BF16) of `type`.
#define GGML_EXT_FLOAT_SWITCH(type, Fmt, ...)           \
  switch (type) {                                       \
    case ::ggml_ext::cpu::FloatType::f32: {             \
      using Fmt = F32;                                  \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
    case ::ggml_ext::cpu::FloatType::f16: {             \
      using Fmt = F16;                                  \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
    case ::ggml_ext::cpu::FloatType::bf16: {            \
      using Fmt = BF16;                                 \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
  }
