// The emulator's interface between the Metal shim (which kernels see) and the runtime that schedules the
// lanes of a threadgroup. Plain C++, no Metal keywords: included before the shim's macros.
#pragma once
#include <cstddef>
#include <cstdint>

namespace metal_emu {

constexpr int kSimdWidth = 32;

// One lane's contribution to a simdgroup collective. The lane fills `in` and `arg`, then the runtime waits
// until every active lane of its simdgroup has arrived at a collective, checks they all called the same one
// (same `resolve`), and calls `resolve` once with all slots; it writes each lane's `out`.
struct SimdSlot {
  alignas(16) unsigned char in[64];
  alignas(16) unsigned char out[64];
  int64_t arg;
  bool active;
};
using SimdResolver = void (*)(SimdSlot* slots);  // kSimdWidth slots, inactive ones marked

// Suspends the calling lane until its simdgroup's collective is resolved; returns its slot with `out` set.
SimdSlot& simd_collective(SimdResolver resolve, const char* name, const void* in, size_t size, int64_t arg);

// Suspends the calling lane until every lane of its threadgroup has reached the barrier.
void threadgroup_barrier_wait();

// What a kernel launcher needs to call one lane of a kernel: the bound buffers and threadgroup memory,
// and the lane's built-in values (Metal's [[thread_position_in_grid]] and friends).
struct U3 {
  uint32_t x, y, z;
};
struct Invocation {
  void* const* buffers;      // [[buffer(i)]]
  int n_buffers;
  void* const* tg_memory;    // [[threadgroup(i)]]
  int n_tg_memory;
  U3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid;
  U3 threads_per_threadgroup, threadgroups_per_grid, threads_per_grid;
  uint32_t thread_index_in_threadgroup, thread_index_in_simdgroup, simdgroup_index_in_threadgroup;
  uint32_t simdgroups_per_threadgroup, threads_per_simdgroup;
};
using Launcher = void (*)(const Invocation&);

// Generated launchers register themselves under the kernel's host name at start-up.
struct Registration {
  Registration(const char* host_name, Launcher launcher);
};

// Reports a misuse of the Metal model found by the shim (e.g. a shuffle from an inactive lane) and aborts.
[[noreturn]] void fail(const char* what);

}  // namespace metal_emu
