// The one way the primitives launch their Metal kernels (kernels/metal/*.metal, built into
// mlx_ggml_ext.metallib next to the extension module): through MLX's Metal device and command encoder, so
// MLX orders the dispatch against the kernels that produce the inputs and consume the outputs.
//
// Written against MLX 0.32's mlx/backend/metal/device.h. It cannot be compiled on Linux (metal-cpp needs
// Apple's headers) and has not run on Apple hardware; tests/test_metal_emulation.py dispatches the
// kernels with the same grids and arguments on the project's Metal emulator.
#pragma once
#include <cstdint>
#include <string>

#include "csrc/backend/metal/launch_plans.h"
#include "csrc/utils.h"
#include "mlx/backend/metal/device.h"

namespace mlx_ggml_ext {

// "f32", "f16" or "bf16": the dtype suffix of the kernels' host names.
const char* metal_dtype_suffix(mx::Dtype dtype);

// The kernels index with 32-bit counts (and 64-bit offsets): v, or a clear error rather than a wrap.
uint32_t checked_u32(int64_t v, const char* op, const char* what);
// A 4-d array's element strides (signed: any view MLX makes) as a kernel's int32 strides, or a clear error naming
// the array (`name`) rather than a wrap.
void checked_strides(const mx::array& a, const char* op, const char* name, int32_t (&out)[4]);

// The type's name as the kernels spell it: "q4_k", "f32".
std::string kernel_type_name(int type, const char* op);

// Blocks are read through their uint16 fields (float weights as whole elements): the data must be aligned
// for them. MLX's buffers are; a view at an odd byte offset into one would not be.
void check_block_alignment(const mx::array& a, int type, const char* op);

// One dispatch of one kernel, from its launch plan (launch_plans.h): bind, then dispatch once.
//   const auto plan = ggml_ext_metal::plan_rms_norm(...);
//   MetalKernel(stream(), plan.kernel).input(x, 0).output(out, 2).bytes(plan.args, 3).dispatch(plan.grid);
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
  // The plan's grid: its threadgroup memory (if any) at [[threadgroup(0)]], then the threadgroups; the
  // threads per threadgroup must fit the compiled kernel's limit.
  void dispatch(const ggml_ext_metal::Grid& grid);

 private:
  // Metal wants a multiple of 16 bytes; rounded up here.
  void threadgroup_memory(size_t bytes, int index);

  std::string name_;
  MTL::ComputePipelineState* pipeline_;
  mx::metal::CommandEncoder& encoder_;
};

}  // namespace mlx_ggml_ext
