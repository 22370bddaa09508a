#include "csrc/ggml_types.h"

#include "kernels/common/ggml_blocks.h"

namespace mlx_ggml_ext {
namespace {

const char* type_name(int type) {
  switch (type) {
    case GGML_EXT_TYPE_F32: return "F32";
    case GGML_EXT_TYPE_F16: return "F16";
    case GGML_EXT_TYPE_BF16: return "BF16";
    case GGML_EXT_TYPE_Q4_0: return "Q4_0";
    case GGML_EXT_TYPE_Q4_1: return "Q4_1";
    case GGML_EXT_TYPE_Q5_0: return "Q5_0";
    case GGML_EXT_TYPE_Q5_1: return "Q5_1";
    case GGML_EXT_TYPE_Q8_0: return "Q8_0";
    case GGML_EXT_TYPE_Q2_K: return "Q2_K";
    case GGML_EXT_TYPE_Q3_K: return "Q3_K";
    case GGML_EXT_TYPE_Q4_K: return "Q4_K";
    case GGML_EXT_TYPE_Q5_K: return "Q5_K";
    case GGML_EXT_TYPE_Q6_K: return "Q6_K";
    case GGML_EXT_TYPE_IQ4_NL: return "IQ4_NL";
    case GGML_EXT_TYPE_IQ4_XS: return "IQ4_XS";
    case GGML_EXT_TYPE_MXFP4: return "MXFP4";
    default: return nullptr;
  }
}

}  // namespace

GGMLTypeInfo ggml_type_info(int type, const char* op) {
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
