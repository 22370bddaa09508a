// The host side of cuda_emu.h, and C entry points that launch each op's kernel the way eval_gpu does
// (the same *_launch functions choose kernel and grid), for ctypes.
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/cuda/kernels.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace {

std::vector<unsigned char> dynamic_shared;
std::unique_ptr<std::barrier<>> block_barrier;
struct Warp {
  std::unique_ptr<std::barrier<>> barrier;
  float lanes[32];
  uint32_t a[32][4], b[32][2];  // mma fragments
};
std::vector<Warp> warps;

// The dynamic shared memory a block may have (cudaDevAttrMaxSharedMemoryPerBlockOptin): a launch asking for more
// fails, as on a GPU.
int block_shared_limit = 232448;

template <typename Args>
int run(const ggml_ext::cuda::KernelLaunch& launch, Args args) {
  if (!launch.kernel) return 1;
  if (launch.shared_bytes > static_cast<unsigned>(block_shared_limit)) return 3;
  auto kernel = reinterpret_cast<void (*)(Args)>(const_cast<void*>(launch.kernel));
  blockDim = launch.block;
  gridDim = launch.grid;
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  if (threads % 32 != 0) return 2;
  for (unsigned bz = 0; bz < gridDim.z; ++bz)
    for (unsigned by = 0; by < gridDim.y; ++by)
      for (unsigned bx = 0; bx < gridDim.x; ++bx) {
        dynamic_shared.assign(launch.shared_bytes + 16, 0xA5);  // garbage, as on a GPU
        block_barrier = std::make_unique<std::barrier<>>(threads);
        warps = std::vector<Warp>(threads / 32);
        for (auto& w : warps) w.barrier = std::make_unique<std::barrier<>>(32);
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t) {
          pool.emplace_back([=] {
            threadIdx = uint3{t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
            blockIdx = uint3{bx, by, bz};
            kernel(args);
          });
        }
        for (auto& th : pool) th.join();
      }
  return 0;
}

}  // namespace

unsigned char* ggml_ext_emulated_dynamic_shared() { return dynamic_shared.data(); }

void __syncthreads() { block_barrier->arrive_and_wait(); }

namespace {
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
};
thread_local std::vector<PendingCopy> open_group;                // issued, not yet committed
thread_local std::vector<std::vector<PendingCopy>> committed;    // oldest first
}  // namespace

void ggml_ext_emulated_copy_async(void* dst, const void* src, int bytes) { open_group.push_back({dst, src, bytes}); }
void ggml_ext_emulated_copy_async_commit() {
  committed.push_back(std::move(open_group));
  open_group.clear();
}
void ggml_ext_emulated_copy_async_wait(int newer_groups_left) {
  while (static_cast<int>(committed.size()) > newer_groups_left) {
    for (const PendingCopy& c : committed.front()) std::memcpy(c.dst, c.src, c.bytes);
    committed.erase(committed.begin());
  }
}

float ggml_ext_emulated_shuffle_xor(float v, int lane_mask) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  Warp& w = warps[t / 32];
  w.lanes[t % 32] = v;
  w.barrier->arrive_and_wait();
  const float other = w.lanes[(t % 32) ^ lane_mask];
  w.barrier->arrive_and_wait();
  return other;
}

// PTX's fragment layout of m16n8k32 (g = lane / 4, t = lane % 4): A[r][k] is byte k % 4 of a[r / 8 + 2 (k / 16)]
// of lane (r % 8, k % 16 / 4); B[k][c] byte k % 4 of b[k / 16] of lane (c, k % 16 / 4); d as in the kernel.
void ggml_ext_emulated_mma_s8_16x8x32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const unsigned th = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  Warp& w = warps[th / 32];
  const int lane = static_cast<int>(th % 32), g = lane / 4, t = lane % 4;
  std::memcpy(w.a[lane], a, sizeof a);
  std::memcpy(w.b[lane], b, sizeof b);
  w.barrier->arrive_and_wait();
  auto byte = [](uint32_t word, int k) { return static_cast<int>(static_cast<int8_t>(word >> (8 * (k % 4)))); };
  auto A = [&](int r, int k) { return byte(w.a[4 * (r % 8) + k % 16 / 4][r / 8 + 2 * (k / 16)], k); };
  auto B = [&](int k, int c) { return byte(w.b[4 * c + k % 16 / 4][k / 16], k); };
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
    int sum = 0;
    for (int k = 0; k < 32; ++k) sum += A(r, k) * B(k, c);
    d[i] = sum;
  }
  w.barrier->arrive_and_wait();
}

namespace kc = ggml_ext::cuda;

extern "C" {

int emulated_rms_norm(kc::RmsNormArgs args, int type) {
  return run(kc::rms_norm_launch(args, static_cast<kc::FloatType>(type)), args);
}

int emulated_rope(kc::RopeArgs args, int type, int neox) {
  return run(kc::rope_launch(args, static_cast<kc::FloatType>(type), neox != 0), args);
}

int emulated_dequantize(kc::DequantizeArgs args, int ggml_type, int out_type) {
  return run(kc::dequantize_launch(args, ggml_type, static_cast<kc::FloatType>(out_type)), args);
}

int emulated_quantized_matmul(kc::QuantizedMatmulArgs args, int ggml_type, int x_type, int transpose) {
  const kc::QuantizedMatmulPlan plan =
      kc::quantized_matmul_plan(args, ggml_type, static_cast<kc::FloatType>(x_type), transpose != 0);
  if (!plan.steps[0].kernel) return 1;
  std::vector<unsigned char> workspace(plan.workspace_bytes + 16, 0xA5);  // garbage, as on a GPU
  args.workspace = plan.workspace_bytes ? workspace.data() : nullptr;
  for (const auto& step : plan.steps) {
    if (!step.kernel) break;
    if (const int err = run(step, args)) return err;
  }
  return 0;
}

}  // extern "C"

// The runtime's device queries (common.cuh's device_attribute): two multiprocessors, so that kernels whose grid
// follows the device's size loop over more rows than one grid covers; an H100's shared memory per multiprocessor
// and per block, unless a test sets the block's limit (emulated_set_block_shared_limit) as a smaller GPU's.
extern "C" void emulated_set_block_shared_limit(int bytes) { block_shared_limit = bytes; }
extern "C" cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 2; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 233472; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = block_shared_limit; break;
    default: *value = 0;
  }
  return cudaSuccess;
}
