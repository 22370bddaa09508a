#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <atomic>
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

// Workers sleep on a condition variable between jobs; the caller runs the first
// range itself. One job at a time (submit_mutex_): kernels from several MLX
// streams take turns rather than oversubscribing the cores.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(threads) {
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
    const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
    const int parts = static_cast<int>(std::min<int64_t>(threads_, max_parts));
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
      pending_.store(parts - 1);
      ++generation_;
    }
    start_cv_.notify_all();
    t_inside_pool = true;
    run_part(0);
    t_inside_pool = false;
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_.load() == 0; });
  }

 private:
  void run_part(int part) {
    const int64_t begin = n_ * part / parts_;
    const int64_t end = n_ * (part + 1) / parts_;
    if (begin < end) fn_(ctx_, begin, end);
  }

  void worker_loop(int index) {
    t_inside_pool = true;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
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
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0;
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
