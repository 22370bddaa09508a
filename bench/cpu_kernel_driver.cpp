// Times of the CPU quantized-matmul kernel (AVX-512 variant) without MLX, next to the streaming-read roofline of
// the same bytes on the same thread pool: for same-machine A/B runs of two builds of kernels/cpu/matmul.cpp (this
// 2-core VM's noise moves single runs of one build by up to 2x, so alternate the builds and compare medians).
//
//   ISA="-mavx2 -mfma -mf16c -mbmi2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512vbmi"
//   F="-std=c++20 -O3 -fno-math-errno -ffp-contract=fast $ISA -DGGML_EXT_X86_VARIANTS=1 -DGGML_EXT_ISA=isa_avx512 -I."
//   g++ $F -c kernels/cpu/matmul.cpp -o mm.o && g++ $F -c kernels/cpu/stream.cpp -o stream.o
//   RUNTIME="kernels/cpu/runtime/isa.cpp kernels/cpu/runtime/parallel.cpp"
//   g++ -std=c++20 -O2 -DGGML_EXT_X86_VARIANTS=1 -I. bench/cpu_kernel_driver.cpp $RUNTIME mm.o stream.o -o cpu_driver
//   ./cpu_driver Q4_0 14336 4096 8 [reps]      # type, N, K, rows of x (m), rounds; PRECISE=1: precise_x
// For the AVX2 variant: ISA="-mavx2 -mfma -mf16c -mbmi2", GGML_EXT_ISA=isa_avx2 in F, and -DDRIVER_ISA=isa_avx2 on
// the driver's line (CPUs without AVX-512 VNNI + VBMI, e.g. Zen 3, run that variant).
//
// Each round times 4 products on 4 distinct weights (so they come from DRAM, not the 32 MB L3), then a streaming
// read of the same 4 weights; one JSON line with the medians and their ratio (fraction_of_roofline). The blocks
// are random codes with every float16 scale 0.01 (MXFP4's exponent 2^-7): the kernels do not branch on values.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/stream.h"

#ifndef DRIVER_ISA
#define DRIVER_ISA isa_avx512
#endif
namespace ggml_ext::cpu::DRIVER_ISA {
void quantized_matmul(const MatmulArgs&);
void stream_read(const StreamArgs&);
}  // namespace ggml_ext::cpu::DRIVER_ISA

namespace {
using namespace ggml_ext::cpu;

struct TypeInfo {
  const char* name;
  int id;
  std::vector<int> half_fields;  // byte offsets of the block's float16 scales
};
const TypeInfo kTypes[] = {
    {"Q4_0", GGML_EXT_TYPE_Q4_0, {0}},     {"Q4_1", GGML_EXT_TYPE_Q4_1, {0, 2}},
    {"Q5_0", GGML_EXT_TYPE_Q5_0, {0}},     {"Q5_1", GGML_EXT_TYPE_Q5_1, {0, 2}},
    {"Q8_0", GGML_EXT_TYPE_Q8_0, {0}},     {"Q2_K", GGML_EXT_TYPE_Q2_K, {80, 82}},
    {"Q3_K", GGML_EXT_TYPE_Q3_K, {108}},   {"Q4_K", GGML_EXT_TYPE_Q4_K, {0, 2}},
    {"Q5_K", GGML_EXT_TYPE_Q5_K, {0, 2}},  {"Q6_K", GGML_EXT_TYPE_Q6_K, {208}},
    {"IQ4_NL", GGML_EXT_TYPE_IQ4_NL, {0}}, {"IQ4_XS", GGML_EXT_TYPE_IQ4_XS, {0}},
    {"MXFP4", GGML_EXT_TYPE_MXFP4, {}},   {"IQ1_S", GGML_EXT_TYPE_IQ1_S, {0}},
    {"IQ1_M", GGML_EXT_TYPE_IQ1_M, {}},    {"IQ2_XXS", GGML_EXT_TYPE_IQ2_XXS, {0}},
    {"IQ2_XS", GGML_EXT_TYPE_IQ2_XS, {0}}, {"IQ2_S", GGML_EXT_TYPE_IQ2_S, {0}},
    {"IQ3_XXS", GGML_EXT_TYPE_IQ3_XXS, {0}}, {"IQ3_S", GGML_EXT_TYPE_IQ3_S, {0}},
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s TYPE N K M [rounds]\n", argv[0]);
    return 2;
  }
  const TypeInfo* type = nullptr;
  for (const auto& t : kTypes)
    if (std::strcmp(t.name, argv[1]) == 0) type = &t;
  const int64_t n = std::atoll(argv[2]), k = std::atoll(argv[3]), m = std::atoll(argv[4]);
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 15;
  if (!type || n <= 0 || m <= 0 || k <= 0 || k % ggml_ext_block_size(type->id) != 0 || rounds <= 0) {
    std::fprintf(stderr, "unknown type, or K not a multiple of the block size, or a size <= 0\n");
    return 2;
  }
  // PRECISE=1: x in two int8 passes (MatmulArgs::precise_x, what a model's output head takes by default).
  const bool precise = std::getenv("PRECISE") && std::atoi(std::getenv("PRECISE")) == 1;
  constexpr int kWeights = 4;
  const int64_t block_bytes = ggml_ext_type_size(type->id);
  const int64_t row_bytes = k / ggml_ext_block_size(type->id) * block_bytes;
  std::mt19937 rng(1);
  std::vector<std::vector<uint8_t>> weights(kWeights, std::vector<uint8_t>(n * row_bytes));
  const uint16_t scale = 0x211F;  // 0.01 in float16
  for (auto& w : weights) {
    for (auto& b : w) b = static_cast<uint8_t>(rng());
    for (int64_t at = 0; at < static_cast<int64_t>(w.size()); at += block_bytes) {
      for (int field : type->half_fields) std::memcpy(&w[at + field], &scale, 2);
      if (type->id == GGML_EXT_TYPE_MXFP4) w[at] = 120;
      if (type->id == GGML_EXT_TYPE_IQ1_M) {  // d's nibbles: the top of each of the 4 scale words
        for (int q = 0; q < 4; ++q) {
          uint8_t& top = w[at + 49 + 2 * q];
          top = static_cast<uint8_t>((top & 0x0F) | (((scale >> (4 * q)) & 0xF) << 4));
        }
      }
    }
  }
  std::vector<float> x(m * k), out(m * n);
  for (auto& v : x) v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;

  std::vector<double> product_s, read_s;
  float checksum = 0.0f;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    for (auto& w : weights) {
      DRIVER_ISA::quantized_matmul(
          MatmulArgs{x.data(), FloatType::f32, w.data(), type->id, out.data(), FloatType::f32, m, n, k, false,
                     precise});
    }
    product_s.push_back((now() - t0) / kWeights);
    t0 = now();
    for (auto& w : weights) {
      DRIVER_ISA::stream_read(StreamArgs{w.data(), nullptr, static_cast<int64_t>(w.size()) / 64 * 64, &checksum});
    }
    read_s.push_back((now() - t0) / kWeights);
  }
  const double product = median(product_s), read = median(read_s), bytes = static_cast<double>(n * row_bytes);
  std::printf("{\"bench\": \"cpu_kernel_driver\", \"type\": \"%s\", \"shape\": [%lld, %lld], \"m\": %lld, "
              "\"precise_x\": %s, \"threads\": %d, \"rounds\": %d, \"time_ms\": %.4f, \"min_ms\": %.4f, "
              "\"weight_gbs\": %.2f, "
              "\"read_roofline_gbs\": %.2f, \"fraction_of_roofline\": %.3f, \"out0\": %.6g}\n",
              type->name, static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m),
              precise ? "true" : "false", num_threads(), rounds, product * 1e3,
              *std::min_element(product_s.begin(), product_s.end()) * 1e3,
              bytes / product / 1e9, bytes / read / 1e9, read / product, static_cast<double>(out[0]));
  return 0;
}
