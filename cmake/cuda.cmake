# CUDA backend: kernels/cuda/*.cu are pure CUDA translation units (no MLX headers:
# MLX's CUDA headers need a fmt the wheels do not ship); the eval_gpu glue in
# csrc/backend/cuda/*.cpp includes MLX's CUDA headers, with csrc/backend/cuda/shim
# supplying the minimal fmt/format.h they include.
# Ampere and Hopper (each with its PTX, so newer GPUs JIT them) unless the build names its own; set before
# enable_language, which would otherwise pick nvcc's default (sm_75 for CUDA 13).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES "80;90")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set_property(TARGET _ext PROPERTY CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES})

file(GLOB CUDA_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
if(CUDA_KERNEL_SOURCES)
  add_library(ggml_ext_cuda_kernels STATIC ${CUDA_KERNEL_SOURCES})
  target_include_directories(ggml_ext_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR})
  set_target_properties(ggml_ext_cuda_kernels PROPERTIES
    CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" POSITION_INDEPENDENT_CODE ON
    CUDA_SEPARABLE_COMPILATION OFF)
  target_compile_options(ggml_ext_cuda_kernels PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -O3>)
  target_link_libraries(_ext PRIVATE ggml_ext_cuda_kernels)
endif()
target_include_directories(_ext PRIVATE ${PROJECT_SOURCE_DIR}/csrc/backend/cuda/shim)
# The extension registers its kernels with its own (static) CUDA runtime; MLX links
# its runtime statically too, so eval_gpu hands MLX driver-level CUfunction handles.
target_link_libraries(_ext PRIVATE CUDA::cudart_static)
string(REPLACE ";" "," _cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")
target_compile_definitions(_ext PRIVATE MLX_GGML_EXT_CUDA_ARCHITECTURES="${_cuda_archs}")
# ggml rounds d*q before adding the offset: no fused multiply-add in the decoders (bit-identity with gguf).
set_source_files_properties(${PROJECT_SOURCE_DIR}/kernels/cuda/dequantize.cu PROPERTIES COMPILE_OPTIONS "-fmad=false")
# Whatever static libraries end up in the module (on the GPU machine its C++ runtime was linked in statically
# and exported __cxa_throw, and every C++ exception crossing into Python crashed): keep their symbols local.
target_link_options(_ext PRIVATE -Wl,--exclude-libs,ALL)
