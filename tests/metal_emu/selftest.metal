// Kernels that check the emulator itself (not part of the package): each is right or wrong in a way the
// emulator must show. Built only by tests/test_metal_emulation.py.
#include <metal_stdlib>
using namespace metal;

// Reverses each threadgroup's slice through threadgroup memory; with_barrier = 0 drops the barrier that
// orders the writes before the reads (a race that lane scheduling must expose).
[[kernel]] void reverse_through_threadgroup(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                                            constant uint& with_barrier [[buffer(2)]],
                                            threadgroup float* shared [[threadgroup(0)]],
                                            uint gid [[thread_position_in_grid]],
                                            uint tid [[thread_position_in_threadgroup]],
                                            uint threads [[threads_per_threadgroup]]) {
  shared[tid] = x[gid];
  if (with_barrier) threadgroup_barrier(mem_flags::mem_threadgroup);
  y[gid] = shared[threads - 1 - tid];
}

// Reads one element past its buffer when `overrun` is set.
[[kernel]] void copy_with_overrun(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                                  constant uint& overrun [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  y[gid] = x[gid + overrun];
}

// A thread that returns before a barrier the others wait at (undefined on the GPU).
[[kernel]] void return_before_barrier(device float* y [[buffer(0)]], uint tid [[thread_position_in_threadgroup]]) {
  if (tid == 3) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[tid] = 1.0f;
}

// The simd collectives: per lane, the simdgroup's sum and max, lane l's value from lane l ^ 1, from lane
// l + 3 (own value past the end), and lane 5's value.
[[kernel]] void simd_collectives(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                                 uint gid [[thread_position_in_grid]]) {
  const float v = x[gid];
  y[5 * gid + 0] = simd_sum(v);
  y[5 * gid + 1] = simd_max(v);
  y[5 * gid + 2] = simd_shuffle_xor(v, 1);
  y[5 * gid + 3] = simd_shuffle_down(v, 3);
  y[5 * gid + 4] = simd_broadcast(v, 5);
}

// Two ways of reading the same 32 floats per simdgroup, for the traffic model: lane l reads float4 l
// (adjacent 16-byte words: coalesced), or float l * 33 % 128 of 128 floats (scattered: not coalesced).
[[kernel]] void loads_adjacent_or_scattered(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                                            constant uint& scattered [[buffer(2)]],
                                            uint gid [[thread_position_in_grid]]) {
  if (scattered) {
    y[gid] = x[(gid * 33) % 128];
  } else {
    const float4 v = ((device const float4*)x)[gid];
    y[gid] = v.x + v.y + v.z + v.w;
  }
}
