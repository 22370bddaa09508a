#include "csrc/packed_rows.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>

#include "csrc/ggml_types.h"
#include "csrc/huge_pages.h"
#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/packed_rows.h"
#include "kernels/cpu/parallel.h"

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

// Groups of 8 rows convert independently: over the kernels' thread pool (a model's matrices are packed at load,
// gigabytes for a mixture of experts).
mx::array converted(const mx::array& rows, int64_t out_row_bytes,
                    void (*convert)(const uint8_t*, int64_t, int64_t, uint8_t*), int64_t blocks) {
  const int64_t N = rows.shape(0), in_row_bytes = rows.shape(1);
  mx::array out = new_streamed_bytes({rows.shape(0), static_cast<int>(out_row_bytes)}, N * out_row_bytes);
  const uint8_t* in = rows.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  const int64_t group_bytes = std::max<int64_t>(1, cpu::kPackedRows * in_row_bytes);
  cpu::parallel_for(N / cpu::kPackedRows, std::max<int64_t>(1, (int64_t(1) << 20) / group_bytes),
                    [&](int64_t g0, int64_t g1) {
                      const int64_t r0 = g0 * cpu::kPackedRows;
                      convert(in + r0 * in_row_bytes, (g1 - g0) * cpu::kPackedRows, blocks, dst + r0 * out_row_bytes);
                    });
  return out;
}

const char* type_name(int type, const char* op) {
  const auto* packed = cpu::packed_type_info(type);
  return packed ? packed->name : ggml_type_info(type, op).name;
}

// "Q4_K, Q6_K, ... and Q8_0" (the plain types that have a packing), or the packed names.
std::string type_list(bool packed) {
  std::string list;
  const int n = static_cast<int>(std::size(cpu::kPackedTypes));
  for (int i = 0; i < n; ++i) {
    const auto& t = cpu::kPackedTypes[i];
    list += i == 0 ? "" : i + 1 == n ? " and " : ", ";
    list += packed ? t.name : ggml_type_info(t.plain, "pack_rows").name;
  }
  return list;
}

// The error for a type pack_rows has no packing of.
std::invalid_argument not_packable(int type, const char* op) {
  return std::invalid_argument(cat("[", op, "] packs ", type_list(false), " rows only, got ggml type ",
                                   type_name(type, op), cpu::packed_type_info(type) ? " (already packed)." : "."));
}

template <class P>
mx::array convert(const mx::array& a, bool pack, const char* op) {
  const int64_t in_bytes = pack ? sizeof(typename P::Plain) : sizeof(typename P::Packed) / cpu::kPackedRows;
  const int64_t out_bytes = pack ? sizeof(typename P::Packed) / cpu::kPackedRows : sizeof(typename P::Plain);
  const mx::array rows = checked_rows(a, op, pack ? "the blocks" : "the packed bytes", in_bytes);
  const int64_t blocks = rows.shape(1) / in_bytes;
  return converted(rows, blocks * out_bytes, pack ? cpu::pack_rows<P> : cpu::unpack_rows<P>, blocks);
}

}  // namespace

mx::array pack_rows(const mx::array& blocks, int ggml_type) {
  constexpr const char* kOp = "pack_rows";
  std::optional<mx::array> out;
  cpu::PackedFormats::visit(ggml_type, /*plain=*/true, [&](auto p) { out = convert<decltype(p)>(blocks, true, kOp); });
  if (out) return *out;
  throw not_packable(ggml_type, kOp);
}

mx::array unpack_rows(const mx::array& packed, int ggml_type) {
  constexpr const char* kOp = "unpack_rows";
  std::optional<mx::array> out;
  cpu::PackedFormats::visit(ggml_type, /*plain=*/false, [&](auto p) { out = convert<decltype(p)>(packed, false, kOp); });
  if (out) return *out;
  throw std::invalid_argument(cat("[", kOp, "] unpacks ", type_list(true), " (pack_rows' outputs) only, got ggml type ",
                                  type_name(ggml_type, kOp), "."));
}

int packed_type(int ggml_type) {
  const auto* packed = cpu::packing_of(ggml_type);
  if (packed == nullptr) throw not_packable(ggml_type, "pack_rows");
  return packed->type;
}

}  // namespace mlx_ggml_ext
