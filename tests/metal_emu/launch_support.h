// What the launchers written by tests/metal_emu/gen_launchers.py call: bind every parameter of a kernel
// from the lane's Invocation, by the parameter's attribute (read from the source) and its type (deduced
// from the kernel function here, so the generator never parses types). Included after the shim.
#pragma once
#include <cstddef>
#include <type_traits>
#include <utility>

namespace metal_emu {

enum class Attr {
  buffer, threadgroup_memory,
  thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid,
  threads_per_threadgroup, threadgroups_per_grid, threads_per_grid,
  thread_index_in_threadgroup, thread_index_in_simdgroup, simdgroup_index_in_threadgroup,
  simdgroups_per_threadgroup, threads_per_simdgroup,
};
struct ParamBinding {
  Attr attr;
  int index;  // buffer(i) / threadgroup(i)
};

template <typename T>
struct VectorLength : std::integral_constant<int, 1> {};
template <typename E, int N>
struct VectorLength<metal::vec<E, N>> : std::integral_constant<int, N> {};

// A position or size declared as a scalar (x), a 2-vector (x, y) or a 3-vector.
template <typename T>
T from_u3(U3 v) {
  if constexpr (VectorLength<T>::value == 1) {
    return static_cast<T>(v.x);
  } else if constexpr (VectorLength<T>::value == 2) {
    return T(v.x, v.y);
  } else {
    return T(v.x, v.y, v.z);
  }
}

template <typename P>
P bind_param(const Invocation& inv, ParamBinding b, const char* kernel) {
  if constexpr (std::is_pointer_v<P> || std::is_reference_v<P>) {
    const bool is_buffer = b.attr == Attr::buffer;
    if (!is_buffer && b.attr != Attr::threadgroup_memory) fail("a pointer parameter with a built-in attribute");
    void* const* table = is_buffer ? inv.buffers : inv.tg_memory;
    const int count = is_buffer ? inv.n_buffers : inv.n_tg_memory;
    if (b.index >= count || table[b.index] == nullptr) {
      std::fprintf(stderr, "metal_emu: %s: %s(%d) is not bound\n", kernel, is_buffer ? "buffer" : "threadgroup",
                   b.index);
      fail("unbound kernel argument");
    }
    if constexpr (std::is_pointer_v<P>) {
      return reinterpret_cast<P>(table[b.index]);
    } else {
      return *reinterpret_cast<std::remove_reference_t<P>*>(table[b.index]);
    }
  } else {
    switch (b.attr) {
      case Attr::thread_position_in_grid: return from_u3<P>(inv.thread_position_in_grid);
      case Attr::thread_position_in_threadgroup: return from_u3<P>(inv.thread_position_in_threadgroup);
      case Attr::threadgroup_position_in_grid: return from_u3<P>(inv.threadgroup_position_in_grid);
      case Attr::threads_per_threadgroup: return from_u3<P>(inv.threads_per_threadgroup);
      case Attr::threadgroups_per_grid: return from_u3<P>(inv.threadgroups_per_grid);
      case Attr::threads_per_grid: return from_u3<P>(inv.threads_per_grid);
      case Attr::thread_index_in_threadgroup: return P(inv.thread_index_in_threadgroup);
      case Attr::thread_index_in_simdgroup: return P(inv.thread_index_in_simdgroup);
      case Attr::simdgroup_index_in_threadgroup: return P(inv.simdgroup_index_in_threadgroup);
      case Attr::simdgroups_per_threadgroup: return P(inv.simdgroups_per_threadgroup);
      case Attr::threads_per_simdgroup: return P(inv.threads_per_simdgroup);
      default: fail("a value parameter bound to a buffer");
    }
  }
}

template <typename... P, size_t... I>
void call_with_bindings(void (*kernel)(P...), const Invocation& inv, const ParamBinding* b, const char* name,
                        std::index_sequence<I...>) {
  kernel(bind_param<P>(inv, b[I], name)...);
}

template <typename... P, size_t N>
void call_kernel(void (*kernel)(P...), const Invocation& inv, const ParamBinding (&bindings)[N], const char* name) {
  static_assert(sizeof...(P) == N, "the attribute list does not match the kernel's parameters");
  call_with_bindings(kernel, inv, bindings, name, std::index_sequence_for<P...>{});
}

}  // namespace metal_emu
