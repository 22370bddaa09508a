// Python bindings: every op of the package, in one place.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <mutex>

#include "csrc/mapped_file.h"
#include "csrc/attention.h"
#include "csrc/dequantize.h"
#include "csrc/glu.h"
#include "csrc/mul_mat_id.h"
#include "csrc/quantize.h"
#include "csrc/packed_rows.h"
#include "csrc/quantized_matmul.h"
#include "csrc/rms_norm.h"
#include "csrc/rope.h"
#include "csrc/kv_cache.h"
#include "csrc/rope_qkv.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed_rows.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/stream.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace mlx_ggml_ext;
namespace cpu = ggml_ext::cpu;

namespace {

// Buffers for measure_stream, kept between calls so that a benchmark measuring the
// roofline in every round does not page-fault (and unmap) tens of megabytes each time.
struct StreamBuffers {
  std::mutex mutex;
  std::vector<float> src, dst;
  float* prepare(int64_t bytes) {  // returns a 64-byte aligned destination
    if (static_cast<int64_t>(src.size()) < bytes / 4) {
      src.assign(bytes / 4, 1.0f);
      dst.assign(bytes / 4 + 16, 0.0f);
    }
    return dst.data() + (16 - reinterpret_cast<uintptr_t>(dst.data()) % 64 / 4) % 16;
  }
};

// Best-of-`repeats` seconds for a streaming copy or read of `bytes` on the CPU
// kernels' thread pool: the roofline the benchmarks compare against.
double measure_stream(const std::string& kind, int64_t bytes, int repeats) {
  if (kind != "copy" && kind != "copy_nt" && kind != "read") {
    throw std::invalid_argument("kind must be 'copy', 'copy_nt' or 'read'");
  }
  if (bytes <= 0 || repeats <= 0) throw std::invalid_argument("bytes and repeats must be positive");
  bytes = (bytes + 63) / 64 * 64;
  static StreamBuffers buffers;
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(buffers.mutex);
  float checksum = 0.0f;
  cpu::StreamArgs args{buffers.src.data(), nullptr, bytes, &checksum};
  const bool fresh = static_cast<int64_t>(buffers.src.size()) < bytes / 4;
  args.dst = buffers.prepare(bytes);
  args.src = buffers.src.data();
  double best = 1e30;
  for (int i = 0; i < repeats + fresh; ++i) {  // a fresh buffer's first run faults the pages in
    auto t0 = std::chrono::steady_clock::now();
    if (kind == "copy") cpu::stream_copy(args);
    else if (kind == "copy_nt") cpu::stream_copy_nt(args);
    else cpu::stream_read(args);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= fresh) best = std::min(best, dt);
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
  m.def("add_rms_norm", &add_rms_norm, "x"_a, "residual"_a, "weight"_a = nb::none(), "eps"_a = 1e-6f, nb::kw_only(),
        "stream"_a = nb::none(),
        "(h, y): h = x + residual and y = rms_norm(h, weight, eps), one fused pass.");
  m.def("dequantize",
        [](const mx::array& data, int type, const std::vector<int>& shape, mx::Dtype dtype, mx::StreamOrDevice s) {
          return dequantize(data, type, mx::Shape(shape.begin(), shape.end()), dtype, s);
        },
        "data"_a, "ggml_type"_a, "shape"_a, "dtype"_a = mx::float32, nb::kw_only(),
        "stream"_a = nb::none(), "Raw ggml blocks (uint8) of a tensor of logical `shape` as floats.");
  m.def("quantize", &quantize, "w"_a, "ggml_type"_a, nb::kw_only(), "imatrix"_a = nb::none(),
        "stream"_a = nb::none(),
        "Float tensor (..., K) as ggml blocks, uint8 (rows, bytes_per_row); imatrix: optional float32 (K,) "
        "error weights per column.");

  m.def("quantized_matmul", &quantized_matmul, "x"_a, "w"_a, "ggml_type"_a = -1, nb::kw_only(),
        "stream"_a = nb::none(), "precise_x"_a = false,
        "x (..., K) @ W^T for W (N, K) given as ggml blocks (uint8 (N, row_bytes), with ggml_type) or floats.");
  m.def("pack_rows", &pack_rows, "blocks"_a, "ggml_type"_a,
        "Rows of a packable type (uint8 (N, row_bytes), N % 8 == 0; PACKED_TYPES) packed 8 at a time for the CPU "
        "product.");
  m.def("unpack_rows", &unpack_rows, "packed"_a, "ggml_type"_a, "Packed rows back to their blocks.");
  m.def("packed_type", &packed_type, "ggml_type"_a, "The type id of a plain type's packed rows.");
  // The packed types (kernels/cpu/packed_rows.h): "Q4_K_R8" etc. -> (packed id, plain id, bytes per row of a packed
  // block, i.e. per block of the plain row); each id an attribute too.
  nb::dict packed_types;
  for (const auto& t : ggml_ext::cpu::kPackedTypes) {
    packed_types[t.name] = nb::make_tuple(t.type, t.plain, t.row_bytes);
    m.attr(t.name) = t.type;
  }
  m.attr("PACKED_TYPES") = packed_types;
  m.def("mul_mat",
        [](const mx::array& a, int type, const std::vector<int>& a_shape, const mx::array& b, mx::StreamOrDevice s) {
          return mul_mat(a, type, mx::Shape(a_shape.begin(), a_shape.end()), b, s);
        },
        "a"_a, "ggml_type"_a, "a_shape"_a, "b"_a, nb::kw_only(), "stream"_a = nb::none(),
        "ggml_mul_mat in MLX order: a (A3, A2, M, K) blocks or floats, b (B3, B2, N, K) -> (B3, B2, N, M) f32.");

  m.def("mul_mat_id",
        [](const mx::array& w, int type, const std::vector<int>& w_shape, const mx::array& x, const mx::array& ids,
           mx::StreamOrDevice s) {
          return mul_mat_id(w, type, mx::Shape(w_shape.begin(), w_shape.end()), x, ids, s);
        },
        "w"_a, "ggml_type"_a, "w_shape"_a, "x"_a, "ids"_a, nb::kw_only(), "stream"_a = nb::none(),
        "ggml_mul_mat_id: experts w (E, N, K) blocks or floats, x (T, n_used or 1, K), ids (T, n_used)\n"
        "-> (T, n_used, N).");

  m.def("rope",
        [](const mx::array& x, const std::variant<mx::array, int>& positions, int n_dims,
           const std::variant<int, std::string>& mode, float freq_base, float freq_scale, float ext_factor,
           float attn_factor, float beta_fast, float beta_slow, int n_ctx_orig,
           const std::optional<mx::array>& freq_factors, bool heads_first, mx::StreamOrDevice s) {
          RopeParams p{n_dims, std::visit([](const auto& m) { return rope_mode(m); }, mode), freq_base,
                       freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig, heads_first};
          return std::visit([&](const auto& pos) { return rope(x, pos, p, freq_factors, s); }, positions);
        },
        "x"_a, "positions"_a, "n_dims"_a, "mode"_a = "normal", "freq_base"_a = 10000.0f, "freq_scale"_a = 1.0f,
        "ext_factor"_a = 0.0f, "attn_factor"_a = 1.0f, "beta_fast"_a = 32.0f, "beta_slow"_a = 1.0f,
        "n_ctx_orig"_a = 0, "freq_factors"_a = nb::none(), nb::kw_only(), "heads_first"_a = false,
        "stream"_a = nb::none(),
        "ggml rope_ext on x (..., T, H, D), or (..., H, T, D) with heads_first: positions int32 (T,) or an int\n"
        "offset; mode 'normal'/'neox' or 0/2.");

  m.def("rope_qkv",
        [](const mx::array& qkv, const mx::array& positions, int heads, int kv_heads, int n_dims,
           const std::variant<int, std::string>& mode, float freq_base, float freq_scale, float ext_factor,
           float attn_factor, float beta_fast, float beta_slow, int n_ctx_orig,
           const std::optional<mx::array>& freq_factors, bool with_v, const std::optional<mx::array>& q_norm,
           const std::optional<mx::array>& k_norm, float norm_eps, mx::StreamOrDevice s) {
          RopeParams p{n_dims, std::visit([](const auto& m) { return rope_mode(m); }, mode), freq_base,
                       freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig, false};
          return rope_qkv(qkv, positions, QkvHeads{heads, kv_heads, with_v ? kv_heads : 0}, p, freq_factors, q_norm,
                          k_norm, norm_eps, s);
        },
        "qkv"_a, "positions"_a, "heads"_a, "kv_heads"_a, "n_dims"_a, "mode"_a = "normal", "freq_base"_a = 10000.0f,
        "freq_scale"_a = 1.0f, "ext_factor"_a = 0.0f, "attn_factor"_a = 1.0f, "beta_fast"_a = 32.0f,
        "beta_slow"_a = 1.0f, "n_ctx_orig"_a = 0, "freq_factors"_a = nb::none(), nb::kw_only(),
        "with_v"_a = true, "q_norm"_a = nb::none(), "k_norm"_a = nb::none(), "norm_eps"_a = 1e-6f,
        "stream"_a = nb::none(),
        "qkv (..., T, (heads + 2*kv_heads) * D) -> [q (..., heads, T, D), k and v (..., kv_heads, T, D)]; q and k\n"
        "rotated as rope with positions int32 (T,). with_v=False: qkv holds q and k only -> [q, k]. q_norm, k_norm\n"
        "(D,): each q / k head rms-normed with them first.");

  m.def("kv_cache_append", &kv_cache_append, "cache"_a, "rows"_a, "offset"_a, "step"_a = 256, nb::kw_only(),
        "stream"_a = nb::none(),
        "cache (B, H, R, D), rows (B, H, T, D) -> concatenate([cache[:, :, :offset], rows], axis=2), written into\n"
        "the cache's own buffer where MLX lets it be donated and it has room, else into one of offset + T rows\n"
        "rounded up to step.");

  m.def("glu",
        [](const mx::array& gate, const std::optional<mx::array>& up, const std::string& kind,
           std::optional<float> alpha, std::optional<float> limit, mx::StreamOrDevice s) {
          const auto k = glu_kind(kind);
          return glu(gate, up, k, glu_params(k, alpha, limit), s);
        },
        "gate"_a, "up"_a = nb::none(), "kind"_a = "swiglu", nb::kw_only(), "alpha"_a = nb::none(),
        "limit"_a = nb::none(), "stream"_a = nb::none(),
        "ggml's swiglu/geglu/geglu_erf: act(gate) * up; swiglu_oai (alpha, limit): gpt-oss's clamped SwiGLU; up\n"
        "None: gate's last axis holds gate then up.");
  m.def("attention",
        [](const mx::array& q, const mx::array& k, const mx::array& v,
           const std::optional<std::variant<mx::array, std::string>>& mask, float scale, float softcap,
           const std::optional<mx::array>& sinks, mx::StreamOrDevice s) {
          std::optional<mx::array> mask_array;
          bool causal = false;
          if (mask) {
            if (const auto* name = std::get_if<std::string>(&*mask)) {
              if (*name != "causal") {
                throw std::invalid_argument("[attention] mask must be an array, None or 'causal', got '" + *name + "'.");
              }
              causal = true;
            } else {
              mask_array = std::get<mx::array>(*mask);
            }
          }
          return attention(q, k, v, mask_array, causal, scale, softcap, sinks, s);
        },
        "q"_a, "k"_a, "v"_a, "mask"_a = nb::none(), nb::kw_only(), "scale"_a, "softcap"_a = 0.0f,
        "sinks"_a = nb::none(), "stream"_a = nb::none(),
        "ggml's flash_attn_ext in mlx-lm's layout: q (B, Hq, Tq, D), k (B, Hk, Tk, D), v (B, Hk, Tk, Dv).");

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
        "Best-of-repeats seconds of a threaded streaming 'copy', 'copy_nt' (cache-bypassing\n"
        "stores) or 'read' of `bytes`.");

  // GGUF loading: a read-only memory map whose bytes become MLX arrays without a copy.
  constexpr auto non_negative = &MappedFile::non_negative;
  nb::class_<MappedFile>(m, "MappedFile",
                         "A read-only memory map of a whole file. Arrays made by array() point into the "
                         "mapping (when zero_copy) and keep it alive; ranges are bounds-checked (ValueError).")
      .def("__init__", [](MappedFile* self, const std::string& path) {
             try {
               new (self) MappedFile(path);
             } catch (const mapped_file_os_error& e) {
               errno = e.error_code;  // OSError picks the subclass (FileNotFoundError, ...) from it
               PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
               throw nb::python_error();
             }
           }, "path"_a)
      .def_prop_ro("path", &MappedFile::path)
      .def_prop_ro("size", &MappedFile::size, "File size in bytes.")
      .def_prop_ro("zero_copy", &MappedFile::zero_copy,
                   "True when array() shares the mapped pages; False when this MLX allocator needs a copy.")
      .def("bytes", [non_negative](const MappedFile& f, int64_t offset, int64_t nbytes) {
             auto s = f.bytes(non_negative(offset, "offset"), non_negative(nbytes, "nbytes"));
             return nb::bytes(s.data(), s.size());
           }, "offset"_a, "nbytes"_a, "A copy of bytes [offset, offset + nbytes).")
      .def("array", [non_negative](const MappedFile& f, int64_t offset, int64_t nbytes) {
             return f.array(non_negative(offset, "offset"), {nbytes});
           }, "offset"_a, "nbytes"_a, "uint8 array of bytes [offset, offset + nbytes).")
      .def("array", [non_negative](const MappedFile& f, int64_t offset, const std::vector<int64_t>& shape) {
             return f.array(non_negative(offset, "offset"), shape);
           }, "offset"_a, "shape"_a, "uint8 array of `shape` over the bytes from offset on (row-major).")
      .def("prefault", &MappedFile::prefault, nb::call_guard<nb::gil_scoped_release>(),
           "Maps every page of the file into the process now (reading it where the system has not cached it), "
           "so that no later read of it page-faults.")
      .def("view", [](const MappedFile& f) {
             auto owner = new std::shared_ptr<const void>(f.keep_alive());
             nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
             size_t shape[1] = {static_cast<size_t>(f.size())};
             return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(f.data(), 1, shape, keep);
           }, "The whole file as a read-only numpy uint8 array (no copy; keeps the mapping alive).");
}
