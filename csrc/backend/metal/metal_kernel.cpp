#include "csrc/backend/metal/metal_kernel.h"

#include <dlfcn.h>

#include <filesystem>

namespace mlx_ggml_ext {
namespace {

constexpr const char* kLibrary = "mlx_ggml_ext";  // mlx_ggml_ext.metallib, installed beside the module

// The directory of the binary that holds this function: the extension module's, wherever pip put it.
std::string module_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&module_directory), &info) || info.dli_fname == nullptr) {
    throw std::runtime_error("[mlx_ggml_ext] cannot locate the extension module to load its Metal library.");
  }
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

MTL::ComputePipelineState* load_kernel(const mx::Stream& stream, const std::string& name) {
  auto& device = mx::metal::device(stream.device);
  // Loaded once and cached by MLX under kLibrary; the path is only read on the first call.
  static const std::string directory = module_directory();
  MTL::Library* library = device.get_library(kLibrary, directory);
  return device.get_kernel(name, library);
}

}  // namespace

const char* metal_dtype_suffix(mx::Dtype dtype) {
  if (dtype == mx::float32) return "f32";
  if (dtype == mx::float16) return "f16";
  if (dtype == mx::bfloat16) return "bf16";
  throw type_error(cat("[mlx_ggml_ext] no Metal kernel for dtype ", dtype_str(dtype), "."));
}

MetalKernel::MetalKernel(const mx::Stream& stream, const std::string& name)
    : name_(name), pipeline_(load_kernel(stream, name)), encoder_(mx::metal::get_command_encoder(stream)) {
  encoder_.set_compute_pipeline_state(pipeline_);
}

MetalKernel& MetalKernel::input(const mx::array& a, int index) {
  encoder_.set_input_array(a, index);
  return *this;
}

MetalKernel& MetalKernel::output(mx::array& a, int index) {
  encoder_.set_output_array(a, index);
  return *this;
}

MetalKernel& MetalKernel::temporary_input(const mx::array& a, int index) {
  encoder_.set_input_array(a, index);
  encoder_.add_temporary(a);
  return *this;
}

void MetalKernel::threadgroup_memory(size_t bytes, int index) {
  encoder_.set_threadgroup_memory_length((bytes + 15) / 16 * 16, index);
}

void MetalKernel::dispatch(const ggml_ext_metal::Grid& grid) {
  const size_t requested = grid.threads;
  const size_t limit = pipeline_->maxTotalThreadsPerThreadgroup();
  // The kernels' simdgroup arithmetic (lane strides, 16 x 16 quarters of 8 x 8 matrices) assumes Apple's 32.
  if (pipeline_->threadExecutionWidth() != 32) {
    throw std::runtime_error(cat("[mlx_ggml_ext] Metal kernel ", name_, " needs 32-wide simdgroups, this GPU has ",
                                 pipeline_->threadExecutionWidth(), "."));
  }
  if (requested > limit) {
    throw std::runtime_error(cat("[mlx_ggml_ext] Metal kernel ", name_, " allows ", limit,
                                 " threads per threadgroup, ", requested, " requested."));
  }
  if (grid.threadgroup_bytes > 0) threadgroup_memory(grid.threadgroup_bytes, 0);
  if (grid.groups[0] == 0 || grid.groups[1] == 0 || grid.groups[2] == 0) return;
  encoder_.dispatch_threadgroups(MTL::Size(grid.groups[0], grid.groups[1], grid.groups[2]),
                                 MTL::Size(grid.threads, 1, 1));
}

}  // namespace mlx_ggml_ext
