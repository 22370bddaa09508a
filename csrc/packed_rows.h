// Weight rows packed for the CPU's products (kernels/cpu/packed_rows.h has the layout): Q4_K, Q6_K, Q5_0 and
// Q8_0 matrices as Q4_K_R8, Q6_K_R8, Q5_0_R8 and Q8_0_R8, 8 rows interleaved, and back. Eager (they run once, at load): the
// result is a new evaluated array.
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// blocks: uint8 (N, row_bytes) Q4_K, Q6_K, Q5_0 or Q8_0 rows with N a multiple of 8. Returns uint8 (N, K / 256 * 148) of
// type Q4_K_R8 (ggml_ext::cpu::kTypeQ4KR8), resp. Q6_K_R8, Q5_0_R8 and Q8_0_R8 of the plain rows' width, which
// quantized_matmul takes on the CPU.
mx::array pack_rows(const mx::array& blocks, int ggml_type);
// The inverse: packed bytes of type `ggml_type` (Q4_K_R8, Q6_K_R8, Q5_0_R8, Q8_0_R8) back to the blocks they were packed
// from, bit for bit.
mx::array unpack_rows(const mx::array& packed, int ggml_type);
// The packed type id of a plain one (a ValueError for a type that has none).
int packed_type(int ggml_type);

}  // namespace mlx_ggml_ext
