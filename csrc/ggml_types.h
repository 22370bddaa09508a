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

// The ops that take a packed copy of rows (pack_rows: Q4_K_R8 etc., CPU only): the product and the experts'
// product, whose CPU kernel runs the product per expert. Every other op refuses it (it would read the bytes as rows).
bool reads_packed_rows(const char* op);
// Whether `type` is a packed layout (Q4_K_R8 etc.); on a GPU device, a NotImplementedError for one (no GPU kernel
// reads it).
bool is_packed_rows(int type);
void refuse_packed_rows_on_gpu(int type, const mx::Device& device, const char* op);

// The type's layout, or a ValueError naming the op and the unknown id (or a packed type the op cannot read).
GGMLTypeInfo ggml_type_info(int type, const char* op);

// Bytes of a row of `elements` values; a ValueError when elements is not a multiple of the block size.
int64_t ggml_row_bytes(const GGMLTypeInfo& info, int64_t elements, const char* op);

}  // namespace mlx_ggml_ext
