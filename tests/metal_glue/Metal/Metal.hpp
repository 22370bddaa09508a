// A stand-in for Apple's metal-cpp, declaring only what MLX's mlx/backend/metal headers and
// csrc/backend/metal use, with metal-cpp's signatures (read from the metal-cpp that the macOS mlx-metal
// wheel ships). It lets g++ compile the package's Metal glue against MLX's real Metal headers on Linux
// (tests/test_metal_emulation.py: syntax and types only; nothing is linked or run).
#pragma once
#include <cstddef>
#include <cstdint>

namespace NS {
using UInteger = unsigned long;
enum StringEncoding : UInteger { UTF8StringEncoding = 4 };
class Object {};
class String : public Object {};
class AutoreleasePool : public Object {};
template <class T>
class SharedPtr {
 public:
  T* get() const { return ptr_; }
  T* operator->() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};
}  // namespace NS

namespace MTL {
struct Size {
  Size() = default;
  Size(NS::UInteger width, NS::UInteger height, NS::UInteger depth) : width(width), height(height), depth(depth) {}
  NS::UInteger width = 0, height = 0, depth = 0;
};
enum DataType : NS::UInteger {};
class Resource : public NS::Object {};
class Allocation : public NS::Object {};
class Buffer : public Resource {
 public:
  void* contents();
};
class Fence : public NS::Object {};
class Function : public NS::Object {};
class LinkedFunctions : public NS::Object {};
class Library : public NS::Object {};
class ResidencySet : public NS::Object {};
class Device : public NS::Object {};
class CommandQueue : public NS::Object {};
class CommandBuffer : public NS::Object {};
class ComputePipelineState : public NS::Object {
 public:
  NS::UInteger maxTotalThreadsPerThreadgroup() const;
  NS::UInteger threadExecutionWidth() const;
};
class ComputeCommandEncoder : public NS::Object {
 public:
  void setComputePipelineState(const ComputePipelineState* state);
  void setBytes(const void* bytes, NS::UInteger length, NS::UInteger index);
  void setThreadgroupMemoryLength(NS::UInteger length, NS::UInteger index);
};
}  // namespace MTL
