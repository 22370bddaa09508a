// ggml type ids as the primitives see them: name and layout (from kernels/common/ggml_blocks.h), with the
// argument checks the quantized ops share.
#pragma once
#include <cstdint>

#include "csrc/utils.h"

namespace mlx_ggml_ext {

struct GGMLTypeInfo {
  int id;
  const char* name;  // as ggml spells it: "Q4_K"
  int block_size;    // elements per block
  int type_size;     // bytes per block
};

// The one op that takes a packed copy of rows (pack_rows: Q4_K_R8 etc., CPU only); every other op refuses it.
constexpr const char* kPackedRowsOp = "quantized_matmul";

// The type's layout, or a ValueError naming the op and the unknown id (or a packed type the op cannot read).
GGMLTypeInfo ggml_type_info(int type, const char* op);

// Bytes of a row of `elements` values; a ValueError when elements is not a multiple of the block size.
int64_t ggml_row_bytes(const GGMLTypeInfo& info, int64_t elements, const char* op);

}  // namespace mlx_ggml_ext
