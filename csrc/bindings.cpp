// Python bindings: every op of the package, in one place.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <chrono>

#include "csrc/dequantize.h"
#include "csrc/quantize.h"
#include "csrc/rms_norm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/stream.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace mlx_ggml_ext;
namespace cpu = ggml_ext::cpu;

namespace {

// Best-of-`repeats` seconds for a streaming copy or read of `bytes` on the CPU
// kernels' thread pool: the roofline the benchmarks compare against.
double measure_stream(const std::string& kind, int64_t bytes, int repeats) {
  if (kind != "copy" && kind != "read") throw std::invalid_argument("kind must be 'copy' or 'read'");
  if (bytes <= 0 || repeats <= 0) throw std::invalid_argument("bytes and repeats must be positive");
  bytes = (bytes + 63) / 64 * 64;
  std::vector<float> src(bytes / 4, 1.0f), dst(kind == "copy" ? bytes / 4 : 0);
  float checksum = 0.0f;
  cpu::StreamArgs args{src.data(), dst.data(), bytes, &checksum};
  double best = 1e30;
  nb::gil_scoped_release release;
  for (int i = 0; i < repeats + 1; ++i) {  // the first run faults the pages in
    auto t0 = std::chrono::steady_clock::now();
    kind == "copy" ? cpu::stream_copy(args) : cpu::stream_read(args);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, dt);
  }
  return best;
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "mlx-ggml-ext: ggml's formats and operations as MLX primitives (C++ core).";
  nb::module_::import_("mlx.core");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const type_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const not_implemented_error& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });

  m.def("rms_norm", &rms_norm, "x"_a, "weight"_a = nb::none(), "eps"_a = 1e-6f, nb::kw_only(),
        "stream"_a = nb::none(),
        "Fused RMSNorm: x / sqrt(mean(x^2, -1) + eps) * weight, float32 math, one rounding.");
  m.def("dequantize",
        [](const mx::array& data, int type, const std::vector<int>& shape, mx::Dtype dtype, mx::StreamOrDevice s) {
          return dequantize(data, type, mx::Shape(shape.begin(), shape.end()), dtype, s);
        },
        "data"_a, "ggml_type"_a, "shape"_a, "dtype"_a = mx::float32, nb::kw_only(),
        "stream"_a = nb::none(), "Raw ggml blocks (uint8) of a tensor of logical `shape` as floats.");
  m.def("quantize", &quantize, "w"_a, "ggml_type"_a, nb::kw_only(), "stream"_a = nb::none(),
        "Float tensor (..., K) as ggml blocks, uint8 (rows, bytes_per_row).");

  // Runtime configuration and introspection
  m.def("gpu_backend", &gpu_backend, "The GPU backend this build was compiled for: cuda, metal or cpu.");
  m.def("num_threads", &cpu::num_threads, "Threads the CPU kernels use.");
  m.def("set_num_threads", &cpu::set_num_threads, "n"_a,
        "Sets the CPU kernels' thread count (n <= 0: MLX_GGML_EXT_NUM_THREADS or all CPUs).");
  m.def("cpu_isa", [] { return std::string(cpu::isa_name(cpu::active_isa())); },
        "The CPU kernel variant in use: avx512, avx2, base (or neon).");
  m.def("cpu_isas", [] {
          std::vector<std::string> out;
          for (int i = 0; i <= static_cast<int>(cpu::best_supported_isa()); ++i) {
            out.push_back(cpu::isa_name(static_cast<cpu::Isa>(i)));
          }
          return out;
        }, "The CPU kernel variants this CPU can run, baseline first.");
  m.def("set_cpu_isa", [](const std::string& name) {
          for (int i = 0; i <= static_cast<int>(cpu::Isa::avx512); ++i) {
            auto isa = static_cast<cpu::Isa>(i);
            if (name == cpu::isa_name(isa)) {
              if (!cpu::set_isa(isa)) throw std::invalid_argument("this CPU cannot run the " + name + " kernels");
              return;
            }
          }
          throw std::invalid_argument("unknown CPU kernel variant '" + name + "'");
        }, "name"_a, "Selects the CPU kernel variant (for tests and benchmarks).");
  m.def("time_dequantize_kernel", [](int type, int64_t n_blocks, int repeats) {
          nb::gil_scoped_release release;
          return time_dequantize_kernel(type, n_blocks, repeats);
        }, "ggml_type"_a, "n_blocks"_a, "repeats"_a = 5,
        "Best-of-repeats seconds of the CPU dequantize kernel alone on preallocated buffers (float32 out).");
  m.def("measure_stream", &measure_stream, "kind"_a, "bytes"_a, "repeats"_a = 5,
        "Best-of-repeats seconds of a threaded streaming 'copy' or 'read' of `bytes`.");
}
