#include "csrc/backend/metal/metal_kernel.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <limits>

#include "csrc/ggml_types.h"
#include "kernels/common/ggml_blocks.h"

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

uint32_t checked_u32(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument(cat("[", op, "] ", what, " = ", v, " is too large for the Metal kernels."));
  }
  return static_cast<uint32_t>(v);
}

void checked_strides(const mx::array& a, const char* op, const char* name, int32_t (&out)[4]) {
  for (int ax = 0; ax < 4; ++ax) {
    const int64_t s = a.strides()[ax];
    if (s < std::numeric_limits<int32_t>::min() || s > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument(cat("[", op, "] ", name, " of shape ", shape_str(a.shape()), " has stride ", s,
                                      " on axis ", ax, ", too large for the Metal kernel (copy it first)."));
    }
    out[ax] = static_cast<int32_t>(s);
  }
}

std::string kernel_type_name(int type, const char* op) {
  std::string name = ggml_type_info(type, op).name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}

void check_block_alignment(const mx::array& a, int type, const char* op) {
  const size_t align = type == GGML_EXT_TYPE_F32 ? 4 : type == GGML_EXT_TYPE_MXFP4 ? 1 : 2;
  if (reinterpret_cast<uintptr_t>(a.data<uint8_t>()) % align != 0) {
    throw std::invalid_argument(cat("[", op, "] the ", ggml_type_info(type, op).name, " data starts at an offset ",
                                    "not aligned to ", align, " bytes; the Metal kernels need it (copy it first)."));
  }
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
