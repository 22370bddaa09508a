#include "csrc/kv_cache.h"

#include <cstring>

#include "mlx/backend/cpu/encoder.h"

namespace mlx_ggml_ext {
namespace {

// kernels/common/rows_copy.h's copy, a row of `dim` elements at a time (one memcpy where the source's rows are
// contiguous). One thread: a decode token's rows are a few KB, and the whole-cache copy is the rare case of a
// cache MLX could not donate or that is full (every `step` rows).
void copy_rows(const ggml_ext::RowsCopyArgs& a) {
  const int64_t e = a.element_bytes;
  const auto* src = static_cast<const char*>(a.src);
  auto* dst = static_cast<char*>(a.dst);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      for (int64_t r = 0; r < a.rows; ++r) {
        const char* from = src + (b * a.strides[0] + h * a.strides[1] + r * a.strides[2]) * e;
        char* to = dst + (((b * a.heads + h) * a.dst_rows + a.row0 + r) * a.dim) * e;
        if (a.strides[3] == 1) {
          std::memcpy(to, from, a.dim * e);
        } else {
          for (int64_t d = 0; d < a.dim; ++d) std::memcpy(to + d * e, from + d * a.strides[3] * e, e);
        }
      }
    }
  }
}

}  // namespace

void KVCacheAppend::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  output_shapes(inputs);  // throws on inputs that do not fit (never writes past the buffer below)
  auto copies = place(inputs, out, [](const mx::array& a) { return const_cast<void*>(a.data<void>()); });
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  if (copies.empty()) return;
  enc.dispatch([copies = std::move(copies)] {
    for (const auto& copy : copies) copy_rows(copy);
  });
}

}  // namespace mlx_ggml_ext
