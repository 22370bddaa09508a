// Metal: mul_mat_id has no Metal kernel yet. The op refuses a Metal stream when the graph is built
// (NotImplementedError naming the alternative); this definition only completes the primitive.
#include "csrc/mul_mat_id.h"

namespace mlx_ggml_ext {

MLX_GGML_EXT_NO_GPU_KERNEL(MulMatId)

}  // namespace mlx_ggml_ext
