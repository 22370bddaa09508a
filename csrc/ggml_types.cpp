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
  if (const auto* packed = ggml_ext::cpu::packed_type_info(type)) {
    // A packed copy (kernels/cpu/packed_rows.h): only the product reads it; every other op would read its bytes as
    // plain rows.
    if (std::strcmp(op, kPackedRowsOp) != 0) {
      throw std::invalid_argument(cat("[", op, "] ", packed->name, " (rows packed for the CPU by pack_rows) is read by ",
                                      kPackedRowsOp, " only; use unpack_rows to get the blocks back."));
    }
    return {type, packed->name, packed->block_size, packed->row_bytes};
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
