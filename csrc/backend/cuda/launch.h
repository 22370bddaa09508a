// What every eval_gpu of the package does through MLX's CUDA command encoder: register the inputs and the
// output, give the output memory, and launch kernels of kernels/cuda (one argument struct by value).
#pragma once
#include <vector>

#include "csrc/utils.h"
#include "kernels/cuda/kernels.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_ggml_ext::cuda {

// Where outputs and scratch live (MLX_GGML_EXT_CUDA_MEMORY, read once; bench/bench_cuda.py compares them):
//  - device (default): stream-ordered device memory (cudaMallocAsync on the encoder's stream, returned with
//    cudaFreeAsync), what MLX's own kernels get from its allocator. MLX's device allocator is not exported,
//    so these bytes are NOT counted by mx.get_active_memory() / mx.get_peak_memory() or MLX's memory limit.
//  - managed: MLX's exported allocator::malloc, which hands an extension managed memory; counted by MLX,
//    but a fresh buffer faults its pages in on first GPU touch, and MLX copies a cached device buffer into
//    new managed memory (synchronously) before handing it out.
//  - prefetch: managed, plus an asynchronous prefetch to the GPU on the encoder's stream before the kernel.
enum class Memory { device, managed, prefetch };
Memory memory_policy();
const char* memory_policy_name();

// Gives `a` (no data yet) a.nbytes() of memory by the policy; readable by the host like any MLX array.
void allocate(mx::cu::CommandEncoder& enc, mx::array& a);

// The encoder of the primitive's stream with every input and the output registered. The output gets
// `donor`'s buffer when MLX allows donating it (same size, row-contiguous), else allocate().
mx::cu::CommandEncoder& begin(const mx::Stream& stream, const std::vector<mx::array>& inputs, mx::array& out,
                              const mx::array* donor = nullptr);

// The driver handle of a kernel compiled into this extension (MLX links its own CUDA runtime, which does not
// know our kernels), looked up once per kernel, with its dynamic shared memory limit raised to
// `shared_bytes` where that and the kernel's static shared memory exceed the default 48 KB. Throws when the kernel
// cannot run on this GPU.
CUfunction driver_function(const void* kernel, unsigned shared_bytes);

// Launches `launch` (from a kernels/cuda *_launch function) with `args` as its one parameter.
template <typename Args>
void launch(mx::cu::CommandEncoder& enc, const ggml_ext::cuda::KernelLaunch& launch, Args args) {
  enc.add_kernel_node_ex(driver_function(launch.kernel, launch.shared_bytes), launch.grid, launch.block, dim3(),
                         launch.shared_bytes, args);
}

// A small host vector copied into an array the kernel can read; kept alive until the command completes.
mx::array device_constants(mx::cu::CommandEncoder& enc, const std::vector<float>& values);

// `bytes` of scratch for the kernels of one command, kept alive until it completes.
mx::array scratch(mx::cu::CommandEncoder& enc, int64_t bytes);

// Registers what the next kernel reads and writes. MLX's CUDA graph orders a kernel node only after the
// producers of the arrays registered since the previous node, so every kernel of a multi-kernel op registers
// its own (the first one's are registered by begin()).
void register_arrays(mx::cu::CommandEncoder& enc, const std::vector<mx::array>& inputs,
                     const std::vector<mx::array>& outputs);

// Runs a plan of kernels/cuda (steps[Plan::kMaxSteps], an empty step ending it; workspace_bytes of scratch) with
// `args`, whose workspace it points at the scratch. Step 0 always launches (launch() throws where the plan has no
// kernel); it writes the scratch, and every later step reads it and the op's inputs and writes it and `out`, each
// kernel node registering its own arrays (begin() registered the inputs and out for step 0).
template <typename Plan, typename Args>
void launch_plan(mx::cu::CommandEncoder& enc, const Plan& plan, Args& args, const std::vector<mx::array>& inputs,
                 const mx::array& out) {
  std::vector<mx::array> reads = inputs, writes = {out};
  if (plan.workspace_bytes > 0) {
    const mx::array workspace = scratch(enc, plan.workspace_bytes);
    args.workspace = mx::gpu_ptr<void>(workspace);
    register_arrays(enc, {}, {workspace});
    reads.push_back(workspace);
    writes.push_back(workspace);
  }
  launch(enc, plan.steps[0], args);
  for (int i = 1; i < Plan::kMaxSteps && plan.steps[i].kernel; ++i) {
    register_arrays(enc, reads, writes);
    launch(enc, plan.steps[i], args);
  }
}

}  // namespace mlx_ggml_ext::cuda
