// Weight rows packed for the CPU's products (kernels/cpu/packed_rows.h has the layout): Q4_K and Q6_K matrices
// as Q4_K_R8 and Q6_K_R8, 8 rows interleaved, and back. Eager (they run once, at load): the result is a new evaluated array.
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// blocks: uint8 (N, row_bytes) Q4_K or Q6_K rows with N a multiple of 8. Returns uint8 (N, K / 256 * 148) of type
// Q4_K_R8 (ggml_ext::cpu::kTypeQ4KR8), resp. (N, K / 256 * 210) of Q6_K_R8, which quantized_matmul takes on the CPU.
mx::array pack_rows(const mx::array& blocks, int ggml_type);
// The inverse: packed bytes of type `ggml_type` (Q4_K_R8, Q6_K_R8) back to the blocks they were packed from, bit
// for bit.
mx::array unpack_rows(const mx::array& packed, int ggml_type);
// The packed type id of a plain one (a ValueError for a type that has none).
int packed_type(int ggml_type);

}  // namespace mlx_ggml_ext
