#include "csrc/backend/cuda/launch.h"

#include <mutex>
#include <unordered_map>

namespace mlx_ggml_ext::cuda {

mx::cu::CommandEncoder& begin(const mx::Stream& stream, const std::vector<mx::array>& inputs, mx::array& out,
                              const mx::array* donor) {
  auto& enc = mx::cu::get_command_encoder(stream);
  if (donor) {
    allocate_like_or_donate(*donor, out);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  return enc;
}

CUfunction driver_function(const void* kernel) {
  static std::mutex mutex;
  static std::unordered_map<const void*, CUfunction> functions;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = functions.find(kernel);
  if (it != functions.end()) return it->second;
  if (!kernel) throw std::runtime_error("[mlx_ggml_ext] internal error: no CUDA kernel for this case.");
  cudaFunction_t function = nullptr;
  const cudaError_t err = cudaGetFuncBySymbol(&function, kernel);
  if (err != cudaSuccess) {
    throw std::runtime_error(cat("[mlx_ggml_ext] the CUDA kernels of this build cannot run on this GPU (",
                                 cudaGetErrorString(err), "); it was built for CUDA architectures ",
                                 MLX_GGML_EXT_CUDA_ARCHITECTURES, "."));
  }
  return functions[kernel] = reinterpret_cast<CUfunction>(function);
}

mx::array device_constants(mx::cu::CommandEncoder& enc, const std::vector<float>& values) {
  // Copied by the host into MLX's memory, which is managed: the GPU reads it where it is.
  mx::array a(values.begin(), mx::Shape{static_cast<int>(values.size())}, mx::float32);
  enc.add_temporary(a);
  return a;
}

}  // namespace mlx_ggml_ext::cuda
