// Weight rows packed for the CPU's products (kernels/cpu/packed_rows.h has the layouts; PackedFormats the types:
// Q4_K, Q6_K, Q4_0, IQ4_NL, Q5_0, Q8_0), 8 rows interleaved, and back. Eager (they run once, at load): the result
// is a new evaluated array.
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// blocks: uint8 (N, row_bytes) rows of a packable type with N a multiple of 8. Returns uint8 (N, K / 256 * 148) of
// type Q4_K_R8 (ggml_ext::cpu::kTypeQ4KR8) for Q4_K, for the others their packed type of the plain rows' width,
// which quantized_matmul and mul_mat_id take on the CPU.
mx::array pack_rows(const mx::array& blocks, int ggml_type);
// The inverse: packed bytes of type `ggml_type` (Q4_K_R8 etc.) back to the blocks they were packed from, bit for
// bit.
mx::array unpack_rows(const mx::array& packed, int ggml_type);
// The packed type id of a plain one (a ValueError for a type that has none).
int packed_type(int ggml_type);

}  // namespace mlx_ggml_ext
