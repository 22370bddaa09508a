// The one way the primitives launch their Metal kernels (kernels/metal/*.metal, built into
// mlx_ggml_ext.metallib next to the extension module): through MLX's Metal device and command encoder, so
// MLX orders the dispatch against the kernels that produce the inputs and consume the outputs.
//
// Written against MLX 0.32's mlx/backend/metal/device.h. It cannot be compiled on Linux (metal-cpp needs
// Apple's headers) and has not run on Apple hardware; tests/test_metal_emulation.py dispatches the
// kernels with the same grids and arguments on the project's Metal emulator.
#pragma once
#include <string>

#include "csrc/utils.h"
#include "mlx/backend/metal/device.h"

namespace mlx_ggml_ext {

// "f32", "f16" or "bf16": the dtype suffix of the kernels' host names.
const char* metal_dtype_suffix(mx::Dtype dtype);

// One dispatch of one kernel: bind, then dispatch once.
//   MetalKernel k(stream(), "rms_norm_f32");
//   k.input(x, 0).output(out, 2).bytes(args, 3).threadgroup_memory(128, 0).dispatch({rows, 1, 1}, {256, 1, 1});
class MetalKernel {
 public:
  MetalKernel(const mx::Stream& stream, const std::string& name);

  MetalKernel& input(const mx::array& a, int index);
  MetalKernel& output(mx::array& a, int index);
  // An array made here for the kernel (e.g. a small table): bound, and kept alive until the GPU is done.
  MetalKernel& temporary_input(const mx::array& a, int index);
  template <typename T>
  MetalKernel& bytes(const T& value, int index) {
    encoder_.set_bytes(value, index);
    return *this;
  }
  // Metal wants a multiple of 16 bytes; rounded up here.
  MetalKernel& threadgroup_memory(size_t bytes, int index);
  // `groups` threadgroups of `threads` threads each; the threads must fit the compiled kernel's limit.
  void dispatch(MTL::Size groups, MTL::Size threads);

 private:
  std::string name_;
  MTL::ComputePipelineState* pipeline_;
  mx::metal::CommandEncoder& encoder_;
};

}  // namespace mlx_ggml_ext
