// Metal: the fused ops (GLU, attention) have no Metal kernels yet. Their ops refuse a Metal stream when the graph
// is built (NotImplementedError naming the alternative); these definitions only complete the primitives.
#include "csrc/attention.h"
#include "csrc/glu.h"

namespace mlx_ggml_ext {

MLX_GGML_EXT_NO_GPU_KERNEL(GLU)
MLX_GGML_EXT_NO_GPU_KERNEL(Attention)

}  // namespace mlx_ggml_ext
