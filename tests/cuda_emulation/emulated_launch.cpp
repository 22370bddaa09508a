// The host side of cuda_emu.h, and C entry points that launch each op's kernel the way eval_gpu does
// (the same *_launch functions choose kernel and grid), for ctypes.
//
// A block's CUDA threads are fibers on the calling thread: each runs until it waits at a barrier (__syncthreads,
// or a warp's exchange for shuffles, __syncwarp and mma), then the next one runs. Host threads per CUDA thread, as
// before, spent most of the emulation's time in the kernel waking them at every barrier. The order alternates
// between sweeps, so a read that lacks its barrier sees a stale value either way round, and a barrier that some
// threads never reach is reported (error 4) instead of hanging.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/matmul_common.cuh"  // int8_tiles_plan, for the route query

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace {

struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
};

struct Barrier {
  unsigned expected = 0, arrived = 0;
  uint64_t generation = 0;
};

// A fiber's stack, with an inaccessible page below it so that an overflow faults instead of corrupting memory.
class Stack {
 public:
  static constexpr size_t kBytes = 256 << 10;
  Stack() {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    base_ = mmap(nullptr, kBytes + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base_ == MAP_FAILED) throw std::bad_alloc();
    mprotect(base_, page_, PROT_NONE);
  }
  Stack(const Stack&) = delete;
  ~Stack() { munmap(base_, kBytes + page_); }
  char* lowest() const { return static_cast<char*>(base_) + page_; }  // the stack grows down to here

 private:
  void* base_;
  size_t page_;
};

#if defined(__x86_64__) && defined(__linux__)
// x86-64: a switch that saves the System V callee-saved registers on the old stack and swaps stack pointers.
// ucontext's swapcontext also saves the signal mask, a system call per switch (a third of the module's time).
extern "C" void ggml_ext_fiber_switch(void** save_sp, void* next_sp);
asm(R"(
  .text
  .p2align 4
  .globl ggml_ext_fiber_switch
  .hidden ggml_ext_fiber_switch
  .type ggml_ext_fiber_switch, @function
ggml_ext_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ggml_ext_fiber_switch, .-ggml_ext_fiber_switch
)");

struct Context {
  void* sp = nullptr;
};
inline void switch_context(Context& from, Context& to) { ggml_ext_fiber_switch(&from.sp, to.sp); }
// A context that enters entry() (which must never return) on `stack`: six zero registers for the switch to pop,
// then entry's address for its ret, which leaves the stack pointer 8 past a 16-byte boundary as after a call.
inline void start_context(Context& c, const Stack& stack, void (*entry)()) {
  auto* top = reinterpret_cast<uintptr_t*>(stack.lowest() + Stack::kBytes);  // 16-byte aligned
  top[-1] = 0;
  top[-2] = reinterpret_cast<uintptr_t>(entry);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;
  c.sp = top - 8;
}
#else
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void start_context(Context& c, const Stack& stack, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack.lowest();
  c.uc.uc_stack.ss_size = Stack::kBytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

struct Fiber {
  Context context;
  uint3 thread;
  const Barrier* waiting_on = nullptr;  // resumable once that barrier's generation moves past waiting_generation
  uint64_t waiting_generation = 0;
  bool finished = false;
  std::vector<PendingCopy> open_group;              // cp.async copies issued, not yet committed
  std::vector<std::vector<PendingCopy>> committed;  // oldest first
};

std::vector<unsigned char> dynamic_shared;
std::vector<std::unique_ptr<Stack>> stacks;
std::vector<Fiber> fibers;
Fiber* current = nullptr;
Context scheduler;
std::function<void()> kernel_call;

Barrier block_barrier;
struct Warp {
  Barrier barrier;
  float lanes[32];
  uint32_t a[32][4], b[32][2];  // mma fragments
};
std::vector<Warp> warps;

[[noreturn]] void fiber_main() {
  kernel_call();
  current->finished = true;
  switch_context(current->context, scheduler);  // never resumed
  __builtin_unreachable();
}

void arrive_and_wait(Barrier& b) {
  const uint64_t generation = b.generation;
  if (++b.arrived == b.expected) {  // the last to arrive releases the others and goes on
    b.arrived = 0;
    ++b.generation;
    return;
  }
  current->waiting_on = &b;
  current->waiting_generation = generation;
  switch_context(current->context, scheduler);
}

// Runs one block's threads to completion; false when every unfinished thread waits at a barrier that cannot open.
bool run_block(unsigned threads) {
  while (stacks.size() < threads) stacks.push_back(std::make_unique<Stack>());
  fibers = std::vector<Fiber>(threads);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = fibers[t];
    f.thread = uint3{t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
    start_context(f.context, *stacks[t], fiber_main);
  }
  unsigned running = threads;
  for (unsigned sweep = 0; running > 0; ++sweep) {
    bool progressed = false;
    for (unsigned i = 0; i < threads; ++i) {
      Fiber& f = fibers[sweep % 2 ? threads - 1 - i : i];
      if (f.finished || (f.waiting_on && f.waiting_on->generation == f.waiting_generation)) continue;
      f.waiting_on = nullptr;
      current = &f;
      threadIdx = f.thread;
      switch_context(scheduler, f.context);
      progressed = true;
      if (f.finished) --running;
    }
    if (!progressed) return false;
  }
  return true;
}

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
  kernel_call = [=] { kernel(args); };
  for (unsigned bz = 0; bz < gridDim.z; ++bz)
    for (unsigned by = 0; by < gridDim.y; ++by)
      for (unsigned bx = 0; bx < gridDim.x; ++bx) {
        dynamic_shared.assign(launch.shared_bytes + 16, 0xA5);  // garbage, as on a GPU
        block_barrier = Barrier{threads};
        warps = std::vector<Warp>(threads / 32);
        for (auto& w : warps) w.barrier = Barrier{32};
        blockIdx = uint3{bx, by, bz};
        if (!run_block(threads)) return 4;
      }
  return 0;
}

unsigned linear_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

}  // namespace

unsigned char* ggml_ext_emulated_dynamic_shared() { return dynamic_shared.data(); }

void __syncthreads() { arrive_and_wait(block_barrier); }

void ggml_ext_emulated_copy_async(void* dst, const void* src, int bytes) {
  current->open_group.push_back({dst, src, bytes});
}
void ggml_ext_emulated_copy_async_commit() {
  current->committed.push_back(std::move(current->open_group));
  current->open_group.clear();
}
void ggml_ext_emulated_copy_async_wait(int newer_groups_left) {
  auto& committed = current->committed;
  while (static_cast<int>(committed.size()) > newer_groups_left) {
    for (const PendingCopy& c : committed.front()) std::memcpy(c.dst, c.src, c.bytes);
    committed.erase(committed.begin());
  }
}

float ggml_ext_emulated_shuffle_xor(float v, int lane_mask) {
  const unsigned t = linear_thread();
  Warp& w = warps[t / 32];
  w.lanes[t % 32] = v;
  arrive_and_wait(w.barrier);
  const float other = w.lanes[(t % 32) ^ lane_mask];
  arrive_and_wait(w.barrier);
  return other;
}

// PTX's fragment layout of m16n8k32 (g = lane / 4, t = lane % 4): A[r][k] is byte k % 4 of a[r / 8 + 2 (k / 16)]
// of lane (r % 8, k % 16 / 4); B[k][c] byte k % 4 of b[k / 16] of lane (c, k % 16 / 4); d as in the kernel.
void ggml_ext_emulated_mma_s8_16x8x32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const unsigned th = linear_thread();
  Warp& w = warps[th / 32];
  const int lane = static_cast<int>(th % 32), g = lane / 4, t = lane % 4;
  std::memcpy(w.a[lane], a, sizeof a);
  std::memcpy(w.b[lane], b, sizeof b);
  arrive_and_wait(w.barrier);
  auto byte = [](uint32_t word, int k) { return static_cast<int>(static_cast<int8_t>(word >> (8 * (k % 4)))); };
  auto A = [&](int r, int k) { return byte(w.a[4 * (r % 8) + k % 16 / 4][r / 8 + 2 * (k / 16)], k); };
  auto B = [&](int k, int c) { return byte(w.b[4 * c + k % 16 / 4][k / 16], k); };
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
    int sum = 0;
    for (int k = 0; k < 32; ++k) sum += A(r, k) * B(k, c);
    d[i] = sum;
  }
  arrive_and_wait(w.barrier);
}

namespace kc = ggml_ext::cuda;
namespace ggml_ext::cuda {
// kernels/cuda/mul_mat_id.cu: whether mul_mat_id_plan takes the grouped tensor-core tiles (the route, for the tests).
bool mul_mat_id_takes_tiles(const MulMatIdArgs& args, int ggml_type, FloatType x_type, bool transpose);
}  // namespace ggml_ext::cuda

// Runs a plan's steps in order with one workspace (filled with garbage, as on a GPU).
template <typename Plan, typename Args>
int run_plan(const Plan& plan, Args& args) {
  if (!plan.steps[0].kernel) return 1;
  std::vector<unsigned char> workspace(plan.workspace_bytes + 16, 0xA5);
  args.workspace = plan.workspace_bytes ? workspace.data() : nullptr;
  for (const auto& step : plan.steps) {
    if (!step.kernel) break;
    if (const int err = run(step, args)) return err;
  }
  return 0;
}

extern "C" {

int emulated_rms_norm(kc::RmsNormArgs args, int type) {
  return run(kc::rms_norm_launch(args, static_cast<kc::FloatType>(type)), args);
}

int emulated_glu(kc::GluArgs args, int type, int kind) {
  const kc::KernelLaunch launch = kc::glu_launch(args, static_cast<kc::FloatType>(type), kind);
  return launch.kernel ? run(launch, args) : 1;
}

int emulated_rope(kc::RopeArgs args, int type, int neox) {
  return run(kc::rope_launch(args, static_cast<kc::FloatType>(type), neox != 0), args);
}

int emulated_dequantize(kc::DequantizeArgs args, int ggml_type, int out_type) {
  return run(kc::dequantize_launch(args, ggml_type, static_cast<kc::FloatType>(out_type)), args);
}

int emulated_mul_mat_id(kc::MulMatIdArgs args, int ggml_type, int x_type, int transpose) {
  return run_plan(kc::mul_mat_id_plan(args, ggml_type, static_cast<kc::FloatType>(x_type), transpose != 0), args);
}

int emulated_mul_mat_id_takes_tiles(kc::MulMatIdArgs args, int ggml_type, int x_type, int transpose) {
  return kc::mul_mat_id_takes_tiles(args, ggml_type, static_cast<kc::FloatType>(x_type), transpose != 0);
}

int emulated_quantized_matmul(kc::QuantizedMatmulArgs args, int ggml_type, int x_type, int transpose, int float_x) {
  return run_plan(
      kc::quantized_matmul_plan(args, ggml_type, static_cast<kc::FloatType>(x_type), transpose != 0, float_x != 0),
      args);
}

// 1 where the plan of this product is the int8 tiles' (matmul_int8_tiles.cu), 0 where it is another.
int emulated_quantized_matmul_takes_int8_tiles(kc::QuantizedMatmulArgs args, int ggml_type, int x_type, int transpose,
                                               int float_x) {
  const auto type = static_cast<kc::FloatType>(x_type);
  const auto plan = kc::quantized_matmul_plan(args, ggml_type, type, transpose != 0, float_x != 0);
  const auto int8 = kc::int8_tiles_plan(args, ggml_type, type);
  return int8.steps[1].kernel != nullptr && plan.steps[1].kernel == int8.steps[1].kernel;
}

// The plan's tiling is left in *args for the test to see (how many key splits, which loads).
int emulated_attention(kc::AttentionArgs* args, int type) {
  return run_plan(kc::attention_plan(*args, static_cast<kc::FloatType>(type)), *args);
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

// The emulator's own checks (test_cuda_emulation.py::test_emulator_*): a block of 64 threads reversing x through
// shared memory, with or without the barrier between its store and its load; and a barrier that only the first
// warp reaches.
namespace {
struct SelftestArgs {
  const float* x;
  float* y;
  int variant;  // 0: reverse without the barrier, 1: with it, 2: a barrier in divergent code
};

__global__ void selftest_kernel(SelftestArgs args) {
  __shared__ float stage[64];
  const unsigned t = threadIdx.x;
  if (args.variant == 2) {
    if (t < 32) __syncthreads();
    args.y[t] = args.x[t];
    return;
  }
  stage[t] = args.x[t];
  if (args.variant == 1) __syncthreads();
  args.y[t] = stage[63 - t];
}
}  // namespace

extern "C" int emulated_selftest(const float* x, float* y, int variant) {
  ggml_ext::cuda::KernelLaunch launch;
  launch.kernel = reinterpret_cast<const void*>(&selftest_kernel);
  launch.grid = dim3(1);
  launch.block = dim3(64);
  return run(launch, SelftestArgs{x, y, variant});
}
