// A build without a GPU backend: every primitive's eval_gpu says so.
#include "csrc/rms_norm.h"

namespace mlx_ggml_ext {

MLX_GGML_EXT_NO_GPU_KERNEL(RMSNorm)

}  // namespace mlx_ggml_ext
