// What every eval_gpu of the package does through MLX's CUDA command encoder: register the inputs and the
// output, give the output memory, and launch a kernel of kernels/cuda (one argument struct by value).
#pragma once
#include <vector>

#include "csrc/utils.h"
#include "kernels/cuda/kernels.h"
#include "mlx/backend/cuda/device.h"

namespace mlx_ggml_ext::cuda {

// The encoder of the primitive's stream with every input and the output registered. The output gets
// `donor`'s buffer when MLX allows donating it (same size, row-contiguous), else memory from MLX's allocator
// (managed memory for an extension: MLX's device-memory allocator is not exported; counted by MLX, readable
// from the host).
mx::cu::CommandEncoder& begin(const mx::Stream& stream, const std::vector<mx::array>& inputs, mx::array& out,
                              const mx::array* donor = nullptr);

// The driver handle of a kernel compiled into this extension (MLX links its own CUDA runtime, which does not
// know our kernels), looked up once per kernel. Throws when the kernel cannot run on this GPU.
CUfunction driver_function(const void* kernel);

// Launches `launch` (from a kernels/cuda *_launch function) with `args` as its one parameter.
template <typename Args>
void launch(mx::cu::CommandEncoder& enc, const ggml_ext::cuda::KernelLaunch& launch, Args args) {
  enc.add_kernel_node_ex(driver_function(launch.kernel), launch.grid, launch.block, dim3(), launch.shared_bytes,
                         args);
}

// A small host vector copied into an array the kernel can read; kept alive until the command completes.
mx::array device_constants(mx::cu::CommandEncoder& enc, const std::vector<float>& values);

}  // namespace mlx_ggml_ext::cuda
