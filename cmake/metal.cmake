# Metal backend: kernels/metal/*.metal compiled by Apple's Metal compiler (through MLX's
# mlx_build_metallib, from MLX's CMake package) into mlx_ggml_ext.metallib, installed next to the
# extension module, where csrc/backend/metal/metal_kernel.cpp loads it from (the module's own directory).
# The eval_gpu glue in csrc/backend/metal/*.cpp is compiled with the extension (MLX's include directories
# come with the mlx target, metal-cpp included).
execute_process(COMMAND xcrun -sdk macosx -f metal RESULT_VARIABLE _metal_compiler_missing OUTPUT_QUIET ERROR_QUIET)
if(_metal_compiler_missing)
  message(FATAL_ERROR
    "mlx_ggml_ext: the Metal backend needs Apple's Metal compiler (`xcrun -sdk macosx metal`). Install Xcode "
    "or its command line tools; with Xcode 26 and later also the Metal toolchain "
    "(`xcodebuild -downloadComponent MetalToolchain`). -DMLX_GGML_EXT_BACKEND=cpu builds without the GPU kernels.")
endif()

file(GLOB METAL_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/metal/*.metal)
file(GLOB METAL_KERNEL_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/metal/*.h
     ${PROJECT_SOURCE_DIR}/kernels/common/*.h)
mlx_build_metallib(
  TARGET mlx_ggml_ext_metallib
  TITLE mlx_ggml_ext
  SOURCES ${METAL_KERNEL_SOURCES}
  # The kernels include "kernels/..." from the project root and nothing of MLX's.
  INCLUDE_DIRS ${PROJECT_SOURCE_DIR}
  DEPS ${METAL_KERNEL_HEADERS}
  OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
add_dependencies(_ext mlx_ggml_ext_metallib)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mlx_ggml_ext.metallib DESTINATION mlx_ggml_ext)
