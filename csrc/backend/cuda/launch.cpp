#include "csrc/backend/cuda/launch.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace mlx_ggml_ext::cuda {

namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(cat("[mlx_ggml_ext] CUDA ", what, " failed: ", cudaGetErrorString(err)));
  }
}

// Device memory for an output, from this extension's runtime on MLX's stream; the buffer is kept by the
// encoder until the command has run, and given back to the pool on the same stream when the array dies.
void set_device_pool_data(mx::cu::CommandEncoder& enc, mx::array& out) {
  cudaStream_t stream = enc.stream();
  auto* buffer = new mx::cu::CudaBuffer{nullptr, out.nbytes(), 0};
  check_cuda(cudaMallocAsync(&buffer->data, out.nbytes(), stream), "cudaMallocAsync");
  out.set_data(mx::allocator::Data(mx::allocator::Buffer(buffer), [stream](mx::allocator::Buffer b) {
    auto* owned = static_cast<mx::cu::CudaBuffer*>(b.ptr());
    cudaFreeAsync(owned->data, stream);
    delete owned;
  }));
  enc.add_temporary(out);
}

}  // namespace

OutputMemory output_memory() {
  const char* v = std::getenv("MLX_GGML_EXT_CUDA_OUTPUT");
  return v && std::strcmp(v, "device_pool") == 0 ? OutputMemory::device_pool : OutputMemory::mlx_allocator;
}

mx::cu::CommandEncoder& begin(const mx::Stream& stream, const std::vector<mx::array>& inputs, mx::array& out,
                              const mx::array* donor) {
  auto& enc = mx::cu::get_command_encoder(stream);
  if (output_memory() == OutputMemory::device_pool && out.nbytes() > 0) {
    set_device_pool_data(enc, out);
  } else if (donor) {
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
