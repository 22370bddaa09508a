// Helpers shared by the primitives: argument checks with clear messages, dtype
// mapping to the kernels' float formats, and graph-building conveniences.
#pragma once
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "kernels/cpu/types.h"

namespace mlx_ggml_ext {

namespace mx = mlx::core;

// Raised for a wrong dtype or Python type; the bindings turn it into TypeError.
// std::invalid_argument (shapes, values) becomes ValueError.
struct type_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A recognized feature this build does not implement; the bindings turn it into
// NotImplementedError.
struct not_implemented_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string shape_str(const mx::Shape& shape);
std::string dtype_str(mx::Dtype dtype);

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// float32, float16 or bfloat16, or a type_error naming the op and argument.
void check_float_dtype(const mx::array& a, const char* op, const char* arg);
ggml_ext::cpu::FloatType float_type(mx::Dtype dtype);

// The array with row-major contiguous memory: itself when it is evaluated and already is, a no-op node for a
// lazy array that turns out to be (MLX shares the buffer), a copy for transposed, sliced or broadcast inputs.
mx::array row_contiguous(const mx::array& a, mx::StreamOrDevice s);

// An input of an elementwise-layout kernel (rms_norm, rope, glu, quantized_matmul's x): on a CPU stream `a` as it
// is, with no graph node (eval_cpu makes a row-major copy only when the evaluated input turns out strided:
// csrc/backend/cpu/row_major.h), elsewhere row_contiguous(a). Inside a model every such input is lazy when the
// graph is built, so row_contiguous would add a Contiguous node per op, which on the CPU costs the scheduler a
// task each (about 340 per token of a 18-layer model) and nearly always shares the buffer.
mx::array kernel_input(const mx::array& a, const mx::Stream& stream);

// `a` with a new shape of the same size. An evaluated row-major array gets an evaluated view of its own buffer,
// with no graph node: a lazy Reshape would reach row_contiguous as an unevaluated array, and MLX's Contiguous
// shares a buffer only when the buffer is at most 16 KiB larger than the array, which a tensor mapped from a
// GGUF file (whose buffer is the whole file) never is, so every call would copy the weight. Lazy or strided
// arrays get mx::reshape.
mx::array reshape_shared(const mx::array& a, const mx::Shape& shape, mx::StreamOrDevice s);

// Gives `out` the input's own buffer when MLX allows donating it (row-contiguous, same size); false if not.
bool donate(const mx::array& in, mx::array& out);
// The output buffer for a row-contiguous elementwise-shaped result: the input's own
// buffer when MLX allows donating it, else a fresh allocation. Pointless for an input of a
// multi-output primitive: MLX gives every output its own copy of the input list, so such an
// input is held once per output and never donatable (MLX 0.32; add_rms_norm, rope_qkv).
void allocate_like_or_donate(const mx::array& in, mx::array& out);

// A primitive's vjp / jvp as those of `f`, the same numbers built from MLX's ops (a fused primitive's unfused
// graph): the cotangents of the inputs in `argnums`; the tangents of the outputs for those inputs' tangents.
using GraphFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;
std::vector<mx::array> vjp_through(const GraphFn& f, const std::vector<mx::array>& primals,
                                   const std::vector<mx::array>& cotangents, const std::vector<int>& argnums);
std::vector<mx::array> jvp_through(const GraphFn& f, const std::vector<mx::array>& primals,
                                   const std::vector<mx::array>& tangents, const std::vector<int>& argnums,
                                   const mx::Stream& stream);

// MLX's flags of a view with these strides over `data_size` elements of its buffer.
mx::array::Flags view_flags(const mx::Shape& shape, const mx::Strides& strides, size_t data_size);

// An evaluated row-major uint8 array of `shape` (`nbytes` bytes) at `offset` in a buffer that MLX's allocator did
// not make (a mapped file, pages of the package's own); `release` runs once no array holds the buffer.
mx::array array_over_buffer(mx::allocator::Buffer buffer, std::function<void(mx::allocator::Buffer)> release,
                            int64_t offset, const mx::Shape& shape, uint64_t nbytes);

// "cuda", "metal" or "cpu": the GPU backend this build was compiled for.
const char* gpu_backend();

// For eval_gpu of a primitive this build has no kernel for.
[[noreturn]] void throw_no_gpu_kernel(const char* primitive);

}  // namespace mlx_ggml_ext

// The overrides every primitive of the package declares (one UnaryPrimitive each):
// its evaluation per backend, and its transformations.
#define MLX_GGML_EXT_EVAL_OVERRIDES                                                    \
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;        \
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

#define MLX_GGML_EXT_TRANSFORM_OVERRIDES                                               \
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,                    \
                             const std::vector<mx::array>& tangents,                   \
                             const std::vector<int>& argnums) override;                \
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,                    \
                             const std::vector<mx::array>& cotangents,                 \
                             const std::vector<int>& argnums,                          \
                             const std::vector<mx::array>& outputs) override;          \
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(                            \
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override;

// Defines eval_gpu for a primitive this backend has no kernel for yet.
#define MLX_GGML_EXT_NO_GPU_KERNEL(Primitive)                                  \
  void Primitive::eval_gpu(const std::vector<mx::array>&, mx::array&) {      \
    throw_no_gpu_kernel(#Primitive);                                         \
  }
