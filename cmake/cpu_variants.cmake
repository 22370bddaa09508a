# CPU kernels, compiled once per instruction-set level.
#
# Every kernels/cpu/*.cpp is built into one object library per variant with
# GGML_EXT_ISA set to that variant's namespace, so the same source yields
# isa_avx512::f, isa_avx2::f and isa_base::f (no AVX-512 variant with clang: below). The baseline build also defines
# GGML_EXT_ISA_DISPATCH: it holds the public entry points, which pick the best
# variant the running CPU supports. kernels/cpu/runtime/*.cpp (thread pool,
# CPU detection) is compiled once, with baseline flags.

file(GLOB CPU_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cpu/*.cpp)
file(GLOB CPU_RUNTIME_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cpu/runtime/*.cpp)
# Bit-exact with ggml/gguf: (de)quantization must round every product and sum on its own, so no FMA
# contraction there (this comes after the targets' -ffp-contract=fast and wins). RoPE's angle reduction
# (rope.cpp's sincos) needs its roundings as written too: clang 14 with contraction gave angles off by up to
# 1e-4 relative (test_rope's spec grid failed; GCC 12 happened to contract harmlessly).
set_source_files_properties(${PROJECT_SOURCE_DIR}/kernels/cpu/dequantize.cpp
                            ${PROJECT_SOURCE_DIR}/kernels/cpu/quantize.cpp
                            ${PROJECT_SOURCE_DIR}/kernels/cpu/rope.cpp
                            PROPERTIES COMPILE_OPTIONS -ffp-contract=off)

set(_variant_names base)
set(_variant_flags_base "")
set(GGML_EXT_AVX512_VARIANT 0)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i.86)$" AND NOT MSVC)
  list(APPEND _variant_names avx2)
  set(_variant_flags_avx2 -mavx2 -mfma -mf16c -mbmi2)
  # The AVX-512 spans (matmul_dot_avx512_spans.h) name members of constexpr plans as template arguments, which
  # clang (14 here; Apple's on Intel Macs) rejects: with clang the AVX-512 CPUs run the AVX2 variant.
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    list(APPEND _variant_names avx512)
    set(_variant_flags_avx512 -mavx2 -mfma -mf16c -mbmi2 -mavx512f -mavx512bw -mavx512vl
                              -mavx512dq -mavx512vnni -mavx512vbmi)
    set(GGML_EXT_AVX512_VARIANT 1)
  endif()
  set(GGML_EXT_X86_VARIANTS ON)
endif()
# aarch64: NEON is part of the baseline, so the base variant is the NEON one.

add_library(ggml_ext_cpu_kernels STATIC ${CPU_RUNTIME_SOURCES})
target_include_directories(ggml_ext_cpu_kernels PUBLIC ${PROJECT_SOURCE_DIR})
find_package(Threads REQUIRED)
target_link_libraries(ggml_ext_cpu_kernels PUBLIC Threads::Threads)
if(GGML_EXT_X86_VARIANTS)
  target_compile_definitions(ggml_ext_cpu_kernels PUBLIC GGML_EXT_X86_VARIANTS=1
                                                         GGML_EXT_AVX512_VARIANT=${GGML_EXT_AVX512_VARIANT})
endif()

# A sanitized build (MLX_GGML_EXT_SANITIZE) checks memory, not speed: -O1 compiles in a fraction of the time.
set(_kernel_opt -O3)
if(MLX_GGML_EXT_SANITIZE)
  set(_kernel_opt -O1)
endif()

foreach(_v IN LISTS _variant_names)
  add_library(ggml_ext_cpu_${_v} OBJECT ${CPU_KERNEL_SOURCES})
  target_include_directories(ggml_ext_cpu_${_v} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(ggml_ext_cpu_${_v} PRIVATE ${_variant_flags_${_v}} ${_kernel_opt} -fno-math-errno
                                                    -ffp-contract=fast)
  target_compile_definitions(ggml_ext_cpu_${_v} PRIVATE GGML_EXT_ISA=isa_${_v})
  if(GGML_EXT_X86_VARIANTS)
    target_compile_definitions(ggml_ext_cpu_${_v} PRIVATE GGML_EXT_X86_VARIANTS=1
                                                          GGML_EXT_AVX512_VARIANT=${GGML_EXT_AVX512_VARIANT})
  endif()
  if(_v STREQUAL "base")
    target_compile_definitions(ggml_ext_cpu_${_v} PRIVATE GGML_EXT_ISA_DISPATCH=1)
  endif()
  target_sources(ggml_ext_cpu_kernels PRIVATE $<TARGET_OBJECTS:ggml_ext_cpu_${_v}>)
endforeach()
