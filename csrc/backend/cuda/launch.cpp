#include "csrc/backend/cuda/launch.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "csrc/backend/cuda/buffer_cache.h"
#include "mlx/backend/cuda/allocator.h"

namespace mlx_ggml_ext::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(cat("[mlx_ggml_ext] ", what, ": ", cudaGetErrorString(err)));
}

// The stream our device buffers go back to the pool on: by the time an array's memory is released, MLX has
// seen every command that used it complete (it keeps the arrays of a command alive until then).
cudaStream_t release_stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }();
  return stream;
}

// Deleter of a device buffer. MLX may have moved it to managed (or pinned host) memory in the meantime,
// when the host read the array (its Buffer::raw_ptr does that, freeing our device pointer itself).
// Errors are ignored: this may run at interpreter exit, after the CUDA context is gone.
void release_buffer(mx::allocator::Buffer buffer) {
  auto* buf = static_cast<mx::cu::CudaBuffer*>(buffer.ptr());
  if (!buf) return;
  if (buf->data) {
    if (buf->device >= 0) {
      if (!cache_release(buf->device, buf->data, buf->size)) cudaFreeAsync(buf->data, release_stream());
    } else {
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, buf->data) == cudaSuccess &&
          attributes.type == cudaMemoryTypeHost) {
        cudaFreeHost(buf->data);
      } else {
        cudaFree(buf->data);
      }
    }
  }
  delete buf;
}

}  // namespace

Memory memory_policy() {
  static const Memory policy = [] {
    const char* v = std::getenv("MLX_GGML_EXT_CUDA_MEMORY");
    if (!v || !*v || std::strcmp(v, "device") == 0) return Memory::device;
    if (std::strcmp(v, "managed") == 0) return Memory::managed;
    if (std::strcmp(v, "prefetch") == 0) return Memory::prefetch;
    throw std::invalid_argument(cat("[mlx_ggml_ext] MLX_GGML_EXT_CUDA_MEMORY must be device, managed or prefetch, "
                                    "got '", v, "'."));
  }();
  return policy;
}

const char* memory_policy_name() {
  switch (memory_policy()) {
    case Memory::device:
      return "device";
    case Memory::managed:
      return "managed";
    case Memory::prefetch:
      return "prefetch";
  }
  return "?";
}

void allocate(mx::cu::CommandEncoder& enc, mx::array& a) {
  const size_t bytes = a.nbytes();
  const int device = enc.device().cuda_device();
  // Stream-ordered allocation needs CUDA memory pools (MLX falls back the same way without them).
  if (memory_policy() == Memory::device && enc.device().memory_pools()) {
    void* data = bytes ? cached_buffer(device, bytes) : nullptr;
    if (bytes && !data) {
      // The size class's bytes, so the buffer can serve any request of its class once it comes back.
      const size_t class_bytes = cache_class_bytes(bytes);
      check(cudaSetDevice(device), "cudaSetDevice");
      if (cudaMallocAsync(&data, class_bytes, enc.stream()) != cudaSuccess) {
        cudaGetLastError();  // out of memory, maybe only because of what the cache holds: give that back
        clear_buffer_cache();
        check(cudaMallocAsync(&data, class_bytes, enc.stream()), "cudaMallocAsync");
      }
    }
    a.set_data(mx::allocator::Data(mx::allocator::Buffer(new mx::cu::CudaBuffer{data, bytes, device}), release_buffer));
    return;
  }
  a.set_data(mx::allocator::malloc(bytes));
  auto* buf = static_cast<mx::cu::CudaBuffer*>(a.buffer().ptr());
  if (memory_policy() == Memory::prefetch && buf && buf->device < 0 && buf->size) {
#if CUDART_VERSION >= 13000
    cudaMemLocation location{};
    location.type = cudaMemLocationTypeDevice;
    location.id = device;
    check(cudaMemPrefetchAsync(buf->data, buf->size, location, 0, enc.stream()), "cudaMemPrefetchAsync");
#else
    check(cudaMemPrefetchAsync(buf->data, buf->size, device, enc.stream()), "cudaMemPrefetchAsync");
#endif
  }
}

mx::cu::CommandEncoder& begin(const mx::Stream& stream, const std::vector<mx::array>& inputs, mx::array& out,
                              const mx::array* donor) {
  auto& enc = mx::cu::get_command_encoder(stream);
  if (!donor || !donate(*donor, out)) allocate(enc, out);
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  return enc;
}

CUfunction driver_function(const void* kernel, unsigned shared_bytes) {
  static std::mutex mutex;
  static std::unordered_map<const void*, std::pair<CUfunction, unsigned>> functions;  // with its smem limit
  std::lock_guard<std::mutex> lock(mutex);
  if (!kernel) throw std::runtime_error("[mlx_ggml_ext] internal error: no CUDA kernel for this case.");
  auto it = functions.find(kernel);
  if (it == functions.end()) {
    cudaFunction_t function = nullptr;
    const cudaError_t err = cudaGetFuncBySymbol(&function, kernel);
    if (err != cudaSuccess) {
      throw std::runtime_error(cat("[mlx_ggml_ext] the CUDA kernels of this build cannot run on this GPU (",
                                   cudaGetErrorString(err), "); it was built for CUDA architectures ",
                                   MLX_GGML_EXT_CUDA_ARCHITECTURES, "."));
    }
    // The default 48 KB bound static and dynamic shared memory together: the dynamic part's limit is what the
    // kernel's static arrays leave of it.
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
    const unsigned dynamic_limit = static_cast<unsigned>(48 * 1024 - attributes.sharedSizeBytes);
    it = functions.emplace(kernel, std::make_pair(reinterpret_cast<CUfunction>(function), dynamic_limit)).first;
  }
  if (shared_bytes > it->second.second) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)),
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    it->second.second = shared_bytes;
  }
  return it->second.first;
}

mx::array device_constants(mx::cu::CommandEncoder& enc, const std::vector<float>& values) {
  // Copied by the host into MLX's memory, which is managed: the GPU reads it where it is.
  mx::array a(values.begin(), mx::Shape{static_cast<int>(values.size())}, mx::float32);
  enc.add_temporary(a);
  return a;
}

mx::array scratch(mx::cu::CommandEncoder& enc, int64_t bytes) {
  mx::array a(mx::Shape{static_cast<int>(bytes)}, mx::uint8, nullptr, {});
  allocate(enc, a);
  enc.add_temporary(a);
  return a;
}

void register_arrays(mx::cu::CommandEncoder& enc, const std::vector<mx::array>& inputs,
                     const std::vector<mx::array>& outputs) {
  for (const auto& a : inputs) enc.set_input_array(a);
  for (const auto& a : outputs) enc.set_output_array(a);
}

}  // namespace mlx_ggml_ext::cuda
