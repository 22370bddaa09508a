#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace ggml_ext::cpu {
namespace {

int default_threads() {
  if (const char* env = std::getenv("MLX_GGML_EXT_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

thread_local bool t_inside_pool = false;

// How long a thread polls for the next job (or for the others to finish) before it
// sleeps: MLX_GGML_EXT_SPIN_MS, default 50 ms (llama.cpp's threadpool polls for a
// similar time by default, Intel's OpenMP for 200 ms). MLX runs most of its own CPU
// ops on one thread, so between two of our kernels the pool often idles for
// milliseconds; a worker that went to sleep then joins the next kernel late. On this
// project's 2-CPU VM, after 20 ms of MLX's single-threaded work, a 200 us poll let
// half the kernels run on the caller alone (rope 1.8x slower, the streaming copy
// too); polling 30 ms made every round two-threaded. Polling yields the CPU every
// 64 pauses, so runnable threads still get it.
std::chrono::microseconds spin_time() {
  double ms = 50;
  if (const char* env = std::getenv("MLX_GGML_EXT_SPIN_MS")) ms = std::max(0.0, std::atof(env));
  return std::chrono::microseconds(static_cast<int64_t>(ms * 1000));
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready` for up to `spin`; true if it became true.
template <class Ready>
bool spin_until(std::chrono::microseconds spin, Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + spin;
  for (int i = 1;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();  // let a runnable thread (MLX's own) have the core
    }
  }
}

// Workers poll briefly, then sleep on a condition variable between jobs; the caller
// works too. A job
// is cut into a few chunks per thread that the threads claim in turn, so a core
// that is busy elsewhere (a noisy machine, an efficiency core) delays only its own
// chunk instead of holding up a fixed half of the work. One job at a time
// (submit_mutex_): kernels from several MLX streams take turns rather than
// oversubscribing the cores.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(threads), spin_(spin_time()) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      ++generation_;
    }
    start_cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const { return threads_; }

  void run(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
    const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
    const int parts = static_cast<int>(std::min<int64_t>(threads_, max_chunks));
    if (parts <= 1 || t_inside_pool) {
      fn(ctx, 0, n);
      return;
    }
    std::lock_guard<std::mutex> submit(submit_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = fn;
      ctx_ = ctx;
      n_ = n;
      parts_ = parts;
      chunks_ = std::min<int64_t>(max_chunks, int64_t(parts) * kChunksPerThread);
      next_chunk_.store(0);
      pending_.store(parts - 1);
      ++generation_;
    }
    start_cv_.notify_all();
    t_inside_pool = true;
    run_part(0);
    t_inside_pool = false;
    if (spin_until(spin_, [this] { return pending_.load(std::memory_order_acquire) == 0; })) return;
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_.load() == 0; });
  }

 private:
  void run_part(int) {
    for (int64_t c = next_chunk_.fetch_add(1); c < chunks_; c = next_chunk_.fetch_add(1)) {
      const int64_t begin = n_ * c / chunks_, end = n_ * (c + 1) / chunks_;
      if (begin < end) fn_(ctx_, begin, end);
    }
  }

  void worker_loop(int index) {
    t_inside_pool = true;
    uint64_t seen = 0;
    for (;;) {
      spin_until(spin_, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
      {
        // generation_ and the job's fields are read together under the lock
        std::unique_lock<std::mutex> lock(mutex_);
        start_cv_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        if (stopping_) return;
        if (index >= parts_) continue;
      }
      run_part(index);
      if (pending_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_cv_.notify_one();
      }
    }
  }

  const int threads_;
  const std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  std::atomic<uint64_t> generation_{0};  // written under mutex_; polled without it
  bool stopping_ = false;
  RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0;
  static constexpr int64_t kChunksPerThread = 4;
  int64_t chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> pending_{0};
};

std::mutex g_pool_mutex;
std::shared_ptr<ThreadPool> g_pool;

std::shared_ptr<ThreadPool> pool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_shared<ThreadPool>(default_threads());
  return g_pool;
}

}  // namespace

int num_threads() { return pool()->threads(); }

void set_num_threads(int n) {
  auto fresh = std::make_shared<ThreadPool>(n > 0 ? n : default_threads());
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  g_pool = std::move(fresh);  // a job still running on the old pool keeps it alive
}

void parallel_for_raw(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  pool()->run(n, grain, fn, ctx);
}

}  // namespace ggml_ext::cpu
