#include "csrc/packed_rows.h"

#include <cstring>

#include "csrc/ggml_types.h"
#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/packed_rows.h"

namespace mlx_ggml_ext {
namespace {

namespace cpu = ggml_ext::cpu;

// Checks `a` as uint8 (N, blocks * block_bytes) with N a multiple of 8 and returns it evaluated, row-contiguous.
mx::array checked_rows(const mx::array& a, const char* op, const char* what, int64_t block_bytes) {
  if (a.dtype() != mx::uint8) {
    throw type_error(cat("[", op, "] ", what, " must be uint8 bytes, got ", dtype_str(a.dtype()), "."));
  }
  if (a.ndim() != 2 || a.shape(0) % cpu::kPackedRows != 0 || a.shape(1) % block_bytes != 0) {
    throw std::invalid_argument(cat("[", op, "] ", what, " must be (N, bytes per row) with N a multiple of ",
                                    cpu::kPackedRows, " and whole ", block_bytes, "-byte blocks per row, got ",
                                    shape_str(a.shape()), "."));
  }
  mx::array rows = row_contiguous(a, mx::Device::cpu);
  mx::eval(rows);
  return rows;
}

mx::array converted(const mx::array& rows, int64_t out_row_bytes,
                    void (*convert)(const uint8_t*, int64_t, int64_t, uint8_t*), int64_t blocks) {
  const int64_t N = rows.shape(0);
  mx::array out(mx::allocator::malloc(N * out_row_bytes), {rows.shape(0), static_cast<int>(out_row_bytes)}, mx::uint8);
  if (N > 0) convert(rows.data<uint8_t>(), N, blocks, out.data<uint8_t>());
  return out;
}

}  // namespace

mx::array pack_rows(const mx::array& blocks, int ggml_type) {
  constexpr const char* kOp = "pack_rows";
  if (ggml_type != GGML_EXT_TYPE_Q4_K) {
    throw std::invalid_argument(cat("[", kOp, "] packs Q4_K rows only (into Q4_K_R8), got ggml type ",
                                    ggml_type == cpu::kTypeQ4KR8 ? "Q4_K_R8 (already packed)"
                                                                 : ggml_type_info(ggml_type, kOp).name,
                                    "."));
  }
  const mx::array rows = checked_rows(blocks, kOp, "Q4_K blocks", sizeof(block_q4_k));
  const int64_t n_blocks = rows.shape(1) / static_cast<int64_t>(sizeof(block_q4_k));
  return converted(rows, n_blocks * cpu::kPackedQ4KRowBytes, cpu::pack_q4_k_rows, n_blocks);
}

mx::array unpack_rows(const mx::array& packed, int ggml_type) {
  constexpr const char* kOp = "unpack_rows";
  if (ggml_type != cpu::kTypeQ4KR8) {
    throw std::invalid_argument(cat("[", kOp, "] unpacks Q4_K_R8 (pack_rows' output) only, got ggml type ",
                                    ggml_type_info(ggml_type, kOp).name, "."));
  }
  const mx::array rows = checked_rows(packed, kOp, "Q4_K_R8 bytes", cpu::kPackedQ4KRowBytes);
  const int64_t n_blocks = rows.shape(1) / cpu::kPackedQ4KRowBytes;
  return converted(rows, n_blocks * static_cast<int64_t>(sizeof(block_q4_k)), cpu::unpack_q4_k_rows, n_blocks);
}

}  // namespace mlx_ggml_ext
