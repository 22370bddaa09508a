# Metal backend: kernels/metal/*.metal compiled into mlx_ggml_ext.metallib, installed
# next to the extension, where eval_gpu loads it from.
file(GLOB METAL_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/metal/*.metal)
if(METAL_KERNEL_SOURCES)
  mlx_build_metallib(
    TARGET mlx_ggml_ext_metallib
    TITLE mlx_ggml_ext
    SOURCES ${METAL_KERNEL_SOURCES}
    INCLUDE_DIRS ${PROJECT_SOURCE_DIR} ${MLX_INCLUDE_DIRS}
    OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  add_dependencies(_ext mlx_ggml_ext_metallib)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mlx_ggml_ext.metallib DESTINATION mlx_ggml_ext)
endif()
