// CUDA: the primitives whose CUDA kernel is not written yet say so.
#include "csrc/rms_norm.h"

namespace mlx_ggml_ext {

MLX_GGML_EXT_NO_GPU_KERNEL(RMSNorm)

}  // namespace mlx_ggml_ext
