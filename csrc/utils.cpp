#include "csrc/utils.h"

#include <algorithm>

#include "mlx/transforms.h"

namespace mlx_ggml_ext {

std::string shape_str(const mx::Shape& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << (shape.size() == 1 ? ",)" : ")");
  return os.str();
}

std::string dtype_str(mx::Dtype dtype) {
  std::ostringstream os;
  os << dtype;
  return os.str();
}

void check_float_dtype(const mx::array& a, const char* op, const char* arg) {
  const auto d = a.dtype();
  if (d != mx::float32 && d != mx::float16 && d != mx::bfloat16) {
    throw type_error(cat("[", op, "] ", arg, " must be float32, float16 or bfloat16, got ",
                         dtype_str(d), "."));
  }
}

ggml_ext::cpu::FloatType float_type(mx::Dtype dtype) {
  if (dtype == mx::float16) return ggml_ext::cpu::FloatType::f16;
  if (dtype == mx::bfloat16) return ggml_ext::cpu::FloatType::bf16;
  return ggml_ext::cpu::FloatType::f32;
}

mx::array row_contiguous(const mx::array& a, mx::StreamOrDevice s) {
  // An evaluated array already in row-major order needs no node (each node costs the GPU backends several
  // microseconds of encoding per op); a lazy one's layout is unknown until it is evaluated.
  if (a.is_available() && a.flags().row_contiguous && a.data_size() == a.size()) return a;
  return mx::contiguous(a, /*allow_col_major=*/false, s);
}

mx::array kernel_input(const mx::array& a, const mx::Stream& stream) {
  return stream.device == mx::Device::cpu ? a : row_contiguous(a, stream);
}

mx::array reshape_shared(const mx::array& a, const mx::Shape& shape, mx::StreamOrDevice s) {
  if (!(a.is_available() && a.flags().row_contiguous && a.data_size() == a.size())) return mx::reshape(a, shape, s);
  int64_t size = 1;
  for (auto d : shape) size *= d;
  if (size != static_cast<int64_t>(a.size())) return mx::reshape(a, shape, s);  // mx::reshape raises the error
  mx::Strides strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  auto flags = a.flags();
  int64_t largest = 0;
  for (auto d : shape) largest = std::max<int64_t>(largest, d);
  flags.col_contiguous = size <= 1 || size == largest;
  mx::array out(shape, a.dtype(), nullptr, {});
  out.copy_shared_buffer(a, strides, flags, a.data_size());
  out.set_status(mx::array::Status::available);
  return out;
}

bool donate(const mx::array& in, mx::array& out) {
  if (!(in.is_donatable() && in.flags().row_contiguous && in.itemsize() == out.itemsize() &&
        in.size() == out.size())) {
    return false;
  }
  out.copy_shared_buffer(in);
  return true;
}

void allocate_like_or_donate(const mx::array& in, mx::array& out) {
  if (!donate(in, out)) out.set_data(mx::allocator::malloc(out.nbytes()));
}

std::vector<mx::array> vjp_through(const GraphFn& f, const std::vector<mx::array>& primals,
                                   const std::vector<mx::array>& cotangents, const std::vector<int>& argnums) {
  const auto grads = mx::vjp(f, primals, cotangents).second;
  std::vector<mx::array> picked;
  for (int arg : argnums) picked.push_back(grads[arg]);
  return picked;
}

std::vector<mx::array> jvp_through(const GraphFn& f, const std::vector<mx::array>& primals,
                                   const std::vector<mx::array>& tangents, const std::vector<int>& argnums,
                                   const mx::Stream& stream) {
  std::vector<mx::array> all;
  for (const auto& p : primals) all.push_back(mx::zeros_like(p, stream));
  for (size_t i = 0; i < argnums.size(); ++i) all[argnums[i]] = tangents[i];
  return mx::jvp(f, primals, all).second;
}

mx::array::Flags view_flags(const mx::Shape& shape, const mx::Strides& strides, size_t data_size) {
  bool row = true, col = true;
  int64_t expected = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) row = false;
    expected *= shape[i];
  }
  expected = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1 && strides[i] != expected) col = false;
    expected *= shape[i];
  }
  mx::array::Flags flags{};
  flags.row_contiguous = row;
  flags.col_contiguous = col;
  flags.contiguous = static_cast<size_t>(expected) == data_size;
  return flags;
}

mx::array array_over_buffer(mx::allocator::Buffer buffer, std::function<void(mx::allocator::Buffer)> release,
                            int64_t offset, const mx::Shape& shape, uint64_t nbytes) {
  mx::Strides strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  mx::array out(shape, mx::uint8, nullptr, {});
  out.set_data(mx::allocator::Data(buffer, std::move(release)), nbytes, strides, view_flags(shape, strides, nbytes),
               offset);
  out.set_status(mx::array::Status::available);
  return out;
}

const char* gpu_backend() { return MLX_GGML_EXT_GPU_BACKEND; }

void throw_no_gpu_kernel(const char* primitive) {
  throw std::runtime_error(cat("[mlx_ggml_ext] ", primitive,
                               " has no GPU kernel in this build (GPU backend: ", gpu_backend(),
                               "); run it on the CPU with stream=mx.cpu."));
}

}  // namespace mlx_ggml_ext
