// Runs one CPU kernel on inputs from files and writes its output to a file, with no
// MLX: tests/test_cross_kernels.py builds it for another architecture (the NEON
// baseline on aarch64, run under qemu) and checks the outputs against the same
// references as the package's own tests.
//
//   kernel_check dequantize <type id> <blocks> <in> <out>            float32 out
//   kernel_check quantize <type id> <blocks> <in float32> <out>
//   kernel_check rms_norm <float type> <rows> <dim> <eps> <x> <weight or -> <out>
//   kernel_check rope <float type> <tokens> <heads> <dim> <n_dims> <neox 0|1> <freq_base>
//                     <freq_scale> <x> <positions int32> <out>
//   kernel_check matmul <type id> <M> <N> <K> <transpose 0|1> <x float32> <w blocks> <out float32>
//
// Float types: 0 float32, 1 float16, 2 bfloat16 (kernels/cpu/types.h).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"

namespace cpu = ggml_ext::cpu;

namespace {

std::vector<char> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const char* path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

void expect_bytes(const std::vector<char>& v, size_t bytes, const char* what) {
  if (v.size() != bytes) {
    std::fprintf(stderr, "%s: expected %zu bytes, got %zu\n", what, bytes, v.size());
    std::exit(2);
  }
}

int64_t arg(char** argv, int i) { return std::strtoll(argv[i], nullptr, 10); }

int run(int argc, char** argv) {
  const std::string op = argc > 1 ? argv[1] : "";
  if (op == "dequantize" && argc == 6) {
    const int type = static_cast<int>(arg(argv, 2));
    const int64_t blocks = arg(argv, 3);
    auto in = read_file(argv[4]);
    expect_bytes(in, blocks * ggml_ext_type_size(type), "blocks");
    std::vector<float> out(blocks * ggml_ext_block_size(type));
    cpu::dequantize({in.data(), out.data(), type, cpu::FloatType::f32, blocks});
    write_file(argv[5], out.data(), out.size() * sizeof(float));
    return 0;
  }
  if (op == "quantize" && argc == 6) {
    const int type = static_cast<int>(arg(argv, 2));
    const int64_t blocks = arg(argv, 3);
    auto in = read_file(argv[4]);
    expect_bytes(in, blocks * ggml_ext_block_size(type) * sizeof(float), "values");
    std::vector<char> out(blocks * ggml_ext_type_size(type));
    cpu::quantize({in.data(), cpu::FloatType::f32, out.data(), type, blocks});
    write_file(argv[5], out.data(), out.size());
    return 0;
  }
  if (op == "rms_norm" && argc == 9) {
    const auto type = static_cast<cpu::FloatType>(arg(argv, 2));
    const int64_t rows = arg(argv, 3), dim = arg(argv, 4);
    const float eps = std::strtof(argv[5], nullptr);
    const size_t bytes = rows * dim * cpu::float_type_bytes(type);
    auto x = read_file(argv[6]);
    expect_bytes(x, bytes, "x");
    std::vector<char> w;
    if (std::strcmp(argv[7], "-") != 0) {
      w = read_file(argv[7]);
      expect_bytes(w, dim * cpu::float_type_bytes(type), "weight");
    }
    std::vector<char> y(bytes);
    cpu::rms_norm({x.data(), w.empty() ? nullptr : w.data(), y.data(), type, rows, dim, rows, eps});
    write_file(argv[8], y.data(), y.size());
    return 0;
  }
  if (op == "rope" && argc == 13) {
    const auto type = static_cast<cpu::FloatType>(arg(argv, 2));
    const int64_t tokens = arg(argv, 3), heads = arg(argv, 4), dim = arg(argv, 5), n_dims = arg(argv, 6);
    const bool neox = arg(argv, 7) != 0;
    const float freq_base = std::strtof(argv[8], nullptr), freq_scale = std::strtof(argv[9], nullptr);
    const size_t bytes = tokens * heads * dim * cpu::float_type_bytes(type);
    auto x = read_file(argv[10]);
    expect_bytes(x, bytes, "x");
    auto positions = read_file(argv[11]);
    expect_bytes(positions, tokens * sizeof(int32_t), "positions");
    // The SPEC's powf(freq_base, -2/n_dims), no YaRN: mscale is attn_factor = 1.
    const float theta_scale = static_cast<float>(
        std::pow(static_cast<double>(freq_base), static_cast<double>(-2.0f / static_cast<float>(n_dims))));
    std::vector<char> y(bytes);
    cpu::RopeArgs a{x.data(), y.data(), type, reinterpret_cast<const int32_t*>(positions.data()),
                    nullptr, nullptr, 1, tokens, heads, dim, n_dims, 1, 1, neox,
                    cpu::RopeAngles{theta_scale, freq_scale, 1.0f, 1.0f}};
    cpu::rope(a);
    write_file(argv[12], y.data(), y.size());
    return 0;
  }
  if (op == "matmul" && argc == 10) {
    const int type = static_cast<int>(arg(argv, 2));
    const int64_t M = arg(argv, 3), N = arg(argv, 4), K = arg(argv, 5);
    const bool transpose = arg(argv, 6) != 0;
    auto x = read_file(argv[7]);
    expect_bytes(x, M * (transpose ? N : K) * sizeof(float), "x");
    auto w = read_file(argv[8]);
    expect_bytes(w, N * K / ggml_ext_block_size(type) * ggml_ext_type_size(type), "w");
    std::vector<float> out(M * (transpose ? K : N));
    cpu::quantized_matmul({x.data(), cpu::FloatType::f32, w.data(), type, out.data(), cpu::FloatType::f32, M, N, K,
                           transpose});
    write_file(argv[9], out.data(), out.size() * sizeof(float));
    return 0;
  }
  std::fprintf(stderr, "usage: see the comment at the top of kernel_check.cpp\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
