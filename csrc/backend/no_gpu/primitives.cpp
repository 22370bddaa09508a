// A build without a GPU backend: every primitive's eval_gpu says so.
#include "csrc/attention.h"
#include "csrc/dequantize.h"
#include "csrc/glu.h"
#include "csrc/kv_cache.h"
#include "csrc/mul_mat_id.h"
#include "csrc/quantize.h"
#include "csrc/quantized_matmul.h"
#include "csrc/rms_norm.h"
#include "csrc/rope.h"
#include "csrc/rope_qkv.h"

namespace mlx_ggml_ext {

MLX_GGML_EXT_NO_GPU_KERNEL(RMSNorm)
MLX_GGML_EXT_NO_GPU_KERNEL(RoPE)
MLX_GGML_EXT_NO_GPU_KERNEL(Dequantize)
MLX_GGML_EXT_NO_GPU_KERNEL(Quantize)
MLX_GGML_EXT_NO_GPU_KERNEL(QuantizedMatmul)
MLX_GGML_EXT_NO_GPU_KERNEL(GLU)
MLX_GGML_EXT_NO_GPU_KERNEL(Attention)
MLX_GGML_EXT_NO_GPU_KERNEL(MulMatId)
MLX_GGML_EXT_NO_GPU_KERNEL(KVCacheAppend)
void AddRMSNorm::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw_no_gpu_kernel("AddRMSNorm");
}
void RopeQKV::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw_no_gpu_kernel("RopeQKV");
}

}  // namespace mlx_ggml_ext
