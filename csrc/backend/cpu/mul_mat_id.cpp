#include "csrc/mul_mat_id.h"

#include <cstring>

#include "csrc/backend/cpu/row_major.h"
#include "kernels/cpu/mul_mat_id.h"

namespace mlx_ggml_ext {

void MulMatId::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  output_shapes(inputs);  // throws on inputs that do not fit (shapeless compile)
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& enc = mx::cpu::get_command_encoder(stream());
  const auto x = row_major_input(inputs[0], enc);    // (T, X, Kx)
  const auto& w = inputs[1];                          // (E, N, row_bytes), row-contiguous: the op made it so
  const auto ids = row_major_input(inputs[2], enc);  // (T, n_used) int32
  for (const auto& in : {x, w, ids}) enc.set_input_array(in);
  enc.set_output_array(out);
  const int64_t E = w.shape(0), n_used = ids.shape(1);
  ggml_ext::cpu::MulMatIdArgs args{x.data<void>(), float_type(x.dtype()), w.data<void>(), type_,
                                   ids.data<int32_t>(), out.data<void>(), float_type(out.dtype()),
                                   ids.shape(0), n_used, x.shape(1), E, w.shape(1),
                                   transpose_ ? out.shape(2) : x.shape(2), w.shape(2), transpose_, nullptr};
  // The gathered rows and their results in MLX's allocator, whose cache keeps buffers warm between calls (a fresh
  // allocation of prefill's tens of MB page-faults in on every call), held until the task has run.
  const int64_t scratch_bytes = ggml_ext::cpu::mul_mat_id_scratch_bytes(args);
  mx::array scratch({static_cast<int>((scratch_bytes + 4095) / 4096), 4096}, mx::uint8, nullptr, {});  // > 2 GB too
  scratch.set_data(mx::allocator::malloc(scratch.nbytes()));
  args.scratch = scratch.data<void>();
  enc.add_temporary(scratch);
  const int64_t count = static_cast<int64_t>(ids.size());
  enc.dispatch([args, count, E, n_used, out_bytes = out.nbytes()] {
    // ids are data, known only now: a bad one fails the evaluation (MLX rethrows it from mx.eval as a
    // RuntimeError carrying this message) before any weight row is addressed.
    const int64_t bad = ggml_ext::cpu::first_bad_id(args.ids, count, E);
    if (bad >= 0) throw std::invalid_argument(bad_id_message(bad, args.ids[bad], n_used, E));
    if (args.K == 0 || args.N == 0) {  // an empty sum: zeros
      std::memset(args.out, 0, out_bytes);
      return;
    }
    ggml_ext::cpu::mul_mat_id(args);
  });
}

}  // namespace mlx_ggml_ext
