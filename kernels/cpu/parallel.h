// The CPU kernels' thread pool. MLX runs each CPU stream's work on one thread;
// the kernels split their rows over this pool from inside that task.
#pragma once
#include <cstdint>
#include <type_traits>

namespace ggml_ext::cpu {

int num_threads();
// n <= 0 restores the default (MLX_GGML_EXT_NUM_THREADS, else the CPUs this process may use).
void set_num_threads(int n);

using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);

// Runs fn over [0, n) split into contiguous ranges of at least `grain` (a few per
// thread, claimed dynamically; fewer threads for small n). fn may be called several
// times per thread and must not assume one range per thread. Nested calls run inline.
void parallel_for_raw(int64_t n, int64_t grain, RangeFn fn, void* ctx);

template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  using Fn = std::remove_reference_t<F>;
  parallel_for_raw(
      n, grain, [](void* c, int64_t b, int64_t e) { (*static_cast<Fn*>(c))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace ggml_ext::cpu
