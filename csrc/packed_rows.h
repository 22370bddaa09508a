// Weight rows packed for the CPU's products (kernels/cpu/packed_rows.h has the layout): Q4_K matrices as
// Q4_K_R8, 8 rows interleaved, and back. Eager (they run once, at load): the result is a new evaluated array.
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// blocks: uint8 (N, K / 256 * 144) Q4_K rows with N a multiple of 8. Returns uint8 (N, K / 256 * 148) of type
// Q4_K_R8 (ggml_ext::cpu::kTypeQ4KR8), which quantized_matmul takes on the CPU.
mx::array pack_rows(const mx::array& blocks, int ggml_type);
// The inverse: Q4_K_R8 bytes back to the Q4_K blocks they were packed from, bit for bit.
mx::array unpack_rows(const mx::array& packed, int ggml_type);

}  // namespace mlx_ggml_ext
