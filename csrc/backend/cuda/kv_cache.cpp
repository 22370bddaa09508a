// KVCacheAppend's eval_gpu: the output's memory (the cache's buffer, or a new one from MLX's allocator), then its
// copies (the new rows, and the old ones into a new buffer: disjoint rows) in one launch.
#include "csrc/backend/cuda/launch.h"
#include "csrc/kv_cache.h"

namespace mlx_ggml_ext {

void KVCacheAppend::eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) {
  output_shapes(inputs);  // throws on inputs that do not fit (never writes past the buffer below)
  auto& enc = mx::cu::get_command_encoder(stream());
  const auto copies = place(inputs, out, [](const mx::array& a) { return mx::gpu_ptr<void>(a); });
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  if (copies.empty()) return;
  ggml_ext::RowsCopies launch{};
  for (const auto& copy : copies) launch.copy[launch.count++] = copy;
  cuda::launch(enc, ggml_ext::cuda::rows_copy_launch(launch), launch);
}

}  // namespace mlx_ggml_ext
