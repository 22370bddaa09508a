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

bool reads_packed_rows(const char* op) {
  return std::strcmp(op, "quantized_matmul") == 0 || std::strcmp(op, "mul_mat_id") == 0;
}

bool is_packed_rows(int type) { return ggml_ext::cpu::packed_type_info(type) != nullptr; }

void refuse_packed_rows_on_gpu(int type, const mx::Device& device, const char* op) {
  if (device != mx::Device::gpu) return;
  if (const auto* packed = ggml_ext::cpu::packed_type_info(type)) {
    throw not_implemented_error(cat("[", op, "] ", packed->name, " (rows packed by pack_rows) is a CPU layout with no "
                                    "GPU kernel; keep the blocks for the GPU (unpack_rows gives them back)."));
  }
}

GGMLTypeInfo ggml_type_info(int type, const char* op) {
  if (const auto* packed = ggml_ext::cpu::packed_type_info(type)) {
    // A packed copy (kernels/cpu/packed_rows.h): only the products read it; every other op would read its bytes as
    // plain rows.
    if (!reads_packed_rows(op)) {
      throw std::invalid_argument(cat("[", op, "] ", packed->name, " (rows packed for the CPU by pack_rows) is read by "
                                      "quantized_matmul and mul_mat_id only; use unpack_rows to get the blocks back."));
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
