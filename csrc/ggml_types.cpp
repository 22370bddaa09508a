#include "csrc/ggml_types.h"

#include <cstring>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/packed_rows.h"

namespace mlx_ggml_ext {
namespace {

// The name as ggml spells it ("Q4_K"), or nullptr for an id outside the type lists.
#define GGML_EXT_FLOAT_TYPE_NAME(NAME, id, bytes) case GGML_EXT_TYPE_##NAME: return #NAME;
#define GGML_EXT_QUANT_TYPE_NAME(NAME, name, id, qk, bytes) case GGML_EXT_TYPE_##NAME: return #NAME;
const char* type_name(int type) {
  switch (type) {
    GGML_EXT_FOR_EACH_FLOAT_TYPE(GGML_EXT_FLOAT_TYPE_NAME)
    GGML_EXT_FOR_EACH_QUANT_TYPE(GGML_EXT_QUANT_TYPE_NAME)
    default: return nullptr;
  }
}
#undef GGML_EXT_FLOAT_TYPE_NAME
#undef GGML_EXT_QUANT_TYPE_NAME

}  // namespace

GGMLTypeInfo ggml_type_info(int type, const char* op) {
  namespace cpu = ggml_ext::cpu;
  if (type == cpu::kTypeQ4KR8 || type == cpu::kTypeQ6KR8 || type == cpu::kTypeQ80R8) {
    // A packed copy (kernels/cpu/packed_rows.h): a byte width per row of 8 rows' share of a packed block. Only
    // the product reads it; everything else would read its bytes as plain rows.
    const GGMLTypeInfo info = type == cpu::kTypeQ4KR8   ? GGMLTypeInfo{type, "Q4_K_R8", GGML_EXT_QK_K, 148}
                              : type == cpu::kTypeQ6KR8 ? GGMLTypeInfo{type, "Q6_K_R8", GGML_EXT_QK_K, 210}
                                                        : GGMLTypeInfo{type, "Q8_0_R8", GGML_EXT_QK32, 34};
    static_assert(cpu::kPackedQ4KRowBytes == 148 && cpu::kPackedQ6KRowBytes == 210 && cpu::kPackedQ80RowBytes == 34);
    if (std::strcmp(op, kPackedRowsOp) != 0) {
      throw std::invalid_argument(cat("[", op, "] ", info.name, " (rows packed for the CPU by pack_rows) is read by ",
                                      kPackedRowsOp, " only; use unpack_rows to get the blocks back."));
    }
    return info;
  }
  const char* name = type_name(type);
  if (name == nullptr) {
    throw std::invalid_argument(cat("[", op, "] unsupported ggml type id ", type, "."));
  }
  return {type, name, ggml_ext_block_size(type), ggml_ext_type_size(type)};
}

int64_t ggml_row_bytes(const GGMLTypeInfo& info, int64_t elements, const char* op) {
  if (elements % info.block_size != 0) {
    throw std::invalid_argument(cat("[", op, "] ", info.name, " rows must hold a multiple of ", info.block_size,
                                    " elements, got a last axis of ", elements, "."));
  }
  return elements / info.block_size * info.type_size;
}

}  // namespace mlx_ggml_ext
