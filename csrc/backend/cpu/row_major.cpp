#include "csrc/backend/cpu/row_major.h"

#include <cstring>
#include <vector>

namespace mlx_ggml_ext {
namespace {

// Copies `src` (any strides, broadcast axes included) into `dst` in row-major order, a row at a time.
void copy_to_row_major(const mx::array& src, uint8_t* dst) {
  const int nd = src.ndim();
  const size_t item = src.itemsize();
  const uint8_t* base = src.data<uint8_t>();
  if (nd == 0) {
    std::memcpy(dst, base, item);
    return;
  }
  const auto& shape = src.shape();
  const auto& strides = src.strides();
  const int64_t cols = shape[nd - 1], col_stride = strides[nd - 1];
  const int64_t rows = static_cast<int64_t>(src.size()) / cols;
  std::vector<int64_t> index(nd - 1, 0);
  int64_t offset = 0;  // of the current row, in elements
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = base + offset * static_cast<int64_t>(item);
    if (col_stride == 1) {
      std::memcpy(dst, row, cols * item);
    } else {
      for (int64_t c = 0; c < cols; ++c) std::memcpy(dst + c * item, row + c * col_stride * item, item);
    }
    dst += cols * item;
    for (int d = nd - 2; d >= 0; --d) {  // the next row's index, odometer-style
      offset += strides[d];
      if (++index[d] < shape[d]) break;
      offset -= strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace

mx::array row_major_input(const mx::array& a, mx::cpu::CommandEncoder& enc) {
  if (a.flags().row_contiguous && a.data_size() == a.size()) return a;
  mx::array copy(a.shape(), a.dtype(), nullptr, {});
  copy.set_data(mx::allocator::malloc(copy.nbytes()));
  enc.add_temporary(copy);
  if (a.size() != 0) enc.dispatch([src = a, dst = copy.data<uint8_t>()] { copy_to_row_major(src, dst); });
  return copy;
}

}  // namespace mlx_ggml_ext
