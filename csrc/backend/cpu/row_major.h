// Row-major views of a CPU primitive's inputs. The ops hand their CPU primitives inputs in any layout
// (kernel_input in csrc/utils.h); the kernels read row-major memory.
#pragma once
#include "csrc/utils.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {

// `a` itself when its memory is row-major, else a row-major copy of it, written by a task dispatched on `enc`
// before the caller's kernel task (a stream runs its tasks in order) and kept alive by the encoder until then.
mx::array row_major_input(const mx::array& a, mx::cpu::CommandEncoder& enc);

}  // namespace mlx_ggml_ext
