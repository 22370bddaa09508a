// A cache of the device buffers our eval_gpu functions hand out (launch.cpp's allocate), so that a decode
// step's hundreds of small outputs and scratch arrays reuse memory instead of calling cudaMallocAsync and
// cudaFreeAsync for each: on the H100 those two calls plus cudaSetDevice made our ops cost ~7 us more host
// time each than MLX's own, whose outputs come from MLX's (unexported) buffer cache.
//
// Why reuse is safe without events: a buffer reaches release() only when its MLX array is destroyed, and MLX
// keeps every array a command reads or writes alive until that command has completed on the GPU.
#pragma once
#include <cstddef>

namespace mlx_ggml_ext::cuda {

// A device buffer of at least `bytes` (> 0) on `device` from the cache, or nullptr when it has none of that
// size class. Never allocates.
void* cached_buffer(int device, size_t bytes);

// Takes back a buffer of `bytes` (as asked of cached_buffer or allocated with cache_class_bytes(bytes)) that
// no GPU work uses any more. Returns false when the cache is full or disabled: the caller frees it.
bool cache_release(int device, void* data, size_t bytes);

// The bytes to allocate for a request of `bytes`, so that a later request of the same size class finds it.
size_t cache_class_bytes(size_t bytes);

// Frees every cached buffer (after an allocation failed). Returns the bytes freed.
size_t clear_buffer_cache();

// The cache's size limit in bytes: MLX_GGML_EXT_CUDA_CACHE_MB (read once; 0 disables it), 256 MiB by default.
size_t buffer_cache_limit();

}  // namespace mlx_ggml_ext::cuda
