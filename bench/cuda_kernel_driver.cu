// Kernel times of the quantized-matmul plans without MLX: a standalone program linked with kernels/cuda/*.cu,
// for trying kernel variants on the GPU machine in seconds (no MLX wheel, no extension build there).
//
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -lineinfo -arch=sm_90 -I. bench/cuda_kernel_driver.cu \
//        kernels/cuda/quantized_matmul.cu kernels/cuda/matmul_decode*.cu kernels/cuda/matmul_tiles.cu \
//        kernels/cuda/matmul_int8_tiles.cu -o driver
//   ./driver [filter]      # JSON lines; filter: a substring of the case names
//   ./driver --check       # each quantized type's plan against float64 math on the dequantized weight (NMSE)
//   ./driver --prefill [filter]  # m = 512: the int8 tiles (both steps, and the tile kernel alone) against the
//                                # WMMA tiles (tiles_plan, float16 x) on the same weights in the same run
//
// Variant builds: -DGGML_EXT_FRAGMENT_FROM_M=2 routes every format with fragments to the tensor-core kernels from
// m=2 on (so each is timed at every m); -DGGML_EXT_TUNING lets GGML_EXT_STAGED=<warps><stages> (42, 43, 82, 83,
// 162, 24) or =unstaged pick the tensor-core kernel's shape at run time, or =dp4a keep the dp4a kernels at every m
// (kernels/cuda/matmul_decode_plans.cuh).
//
// Each case cycles through enough copies of the weight (>= 256 MB together) that every product reads its weight
// from DRAM, not from the 50 MB L2, as a model's layers would. Times are CUDA-event times of 200 products in a
// row divided by 200 ("step1_us": the dot kernel alone on x quantized once; "plan_us": every step of the plan,
// as the op runs). The rooflines are measured in the same run on the same bytes: "copy": cudaMemcpyAsync of the
// weight bytes (read + write), "read": a kernel that only streams them (16-byte loads, one sum per block).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "bench/cuda_driver_common.cuh"
#include "kernels/cuda/matmul_common.cuh"  // tiles_plan, int8_tiles_plan: the prefill A/B

using namespace ggml_ext::cuda;
using namespace driver;

namespace {

// One batch of x (m rows, f16) against one weight of n rows of row_bytes bytes, as both modes below run it.
QuantizedMatmulArgs single_batch_args(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
                                      int64_t row_bytes) {
  QuantizedMatmulArgs a{};
  a.x = x;
  a.w = w;
  a.y = y;
  a.m = m;
  a.n = n;
  a.k = k;
  a.row_bytes = row_bytes;
  a.batches = a.b2 = a.a2 = a.ratio2 = a.ratio3 = 1;
  return a;
}

}  // namespace

// The plan's result for m rows of x against float64 math on the weight dequantized with ggml_blocks.h's
// reference decoders, as NMSE (the GPU suite's bound for this x: 5e-4).
double check_case(const TypeInfo& t, int64_t n, int64_t k, int m) {
  const int64_t row_bytes = k / t.qk * t.bytes;
  std::vector<uint8_t> w = random_weight_bytes(n * row_bytes, 12345u + static_cast<uint32_t>(t.id));
  uint32_t h = 777u + static_cast<uint32_t>(t.id);
  std::vector<__half> x(m * k);
  std::vector<double> xd(m * k);
  for (int64_t i = 0; i < m * k; ++i) {
    h = h * 1664525u + 1013904223u;
    x[i] = __float2half(static_cast<float>(static_cast<int>(h >> 20) - 2048) / 1024.0f);
    xd[i] = __half2float(x[i]);
  }
  std::vector<double> ref(m * n, 0.0);
  std::vector<float> row(k);
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row(t, w.data() + r * row_bytes, k, row.data());
    for (int i = 0; i < m; ++i) {
      double acc = 0.0;
      for (int64_t j = 0; j < k; ++j) acc += xd[i * k + j] * row[j];
      ref[i * n + r] = acc;
    }
  }
  uint8_t* dw;
  __half* dx;
  float* dy;
  CHECK(cudaMalloc(&dw, w.size()));
  CHECK(cudaMalloc(&dx, x.size() * sizeof(__half)));
  CHECK(cudaMalloc(&dy, m * n * sizeof(float)));
  CHECK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(__half), cudaMemcpyHostToDevice));
  QuantizedMatmulArgs a = single_batch_args(dx, dw, dy, m, n, k, row_bytes);
  a.out_f32 = true;
  const QuantizedMatmulPlan plan = quantized_matmul_plan(a, t.id, FloatType::f16, false);
  void* ws = nullptr;
  if (plan.workspace_bytes) CHECK(cudaMalloc(&ws, plan.workspace_bytes));
  a.workspace = ws;
  for (const auto& step : plan.steps)
    if (step.kernel) launch(step, a);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> y(m * n);
  CHECK(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < m * n; ++i) {
    num += (y[i] - ref[i]) * (y[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  CHECK(cudaFree(dw));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dy));
  if (ws) CHECK(cudaFree(ws));
  return den > 0 ? num / den : num;
}

int check_all() {
  int failures = 0;
  const int64_t shapes[][2] = {{8200, 512}, {1000, 768}};  // above and below kFewRows, partial 16-row tiles
  for (const auto& t : kTypes)
    for (const auto& shape : shapes)
      for (int m : {1, 2, 5, 6, 7, 8}) {
        const double e = check_case(t, shape[0], shape[1], m);
        const bool ok = e <= 5e-4;  // NaN fails too
        failures += !ok;
        std::printf("{\"check\": \"%s %lldx%lld m=%d\", \"nmse\": %.3e, \"ok\": %s}\n", t.name,
                    static_cast<long long>(shape[0]), static_cast<long long>(shape[1]), m, e, ok ? "true" : "false");
      }
  for (const auto& t : kTypes) {  // m > 8: the int8 tiles where the format has fragments, else the WMMA tiles
    const double e = check_case(t, 1000, 768, 40);
    const bool ok = e <= 5e-4;
    failures += !ok;
    std::printf("{\"check\": \"%s 1000x768 m=40\", \"nmse\": %.3e, \"ok\": %s}\n", t.name, e, ok ? "true" : "false");
  }
  std::printf("{\"check_failures\": %d}\n", failures);
  return failures == 0 ? 0 : 1;
}

// Prefill (m = 512, float16 x): the int8 tiles' plan ("int8_us": quantize x + tiles; "int8_tiles_us": the tile
// kernel alone) against the WMMA tiles ("wmma_us"), each cycling through copies of the weight as main's cases do.
int prefill(const std::string& filter) {
  Timer timer;
  const int iters = 50, m = 512;
  const int64_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  for (const auto& shape : shapes)
    for (const char* tname : {"Q4_0", "Q4_K", "Q8_0", "Q6_K", "Q5_K"}) {
      const int64_t n = shape[0], k = shape[1];
      const TypeInfo* t = &type_named(tname);
      const std::string name = std::string(tname) + " " + std::to_string(n) + "x" + std::to_string(k) + " m=512";
      if (name.find(filter) == std::string::npos) continue;
      const int64_t row_bytes = k / t->qk * t->bytes, bytes = n * row_bytes;
      const std::vector<uint8_t*> w = weight_copies(bytes);
      const int copies = static_cast<int>(w.size());
      __half* x;
      __half* y;
      CHECK(cudaMalloc(&x, m * k * sizeof(__half)));
      CHECK(cudaMalloc(&y, m * n * sizeof(__half)));
      fill_half_kernel<<<256, 256>>>(x, m * k);
      QuantizedMatmulArgs a = single_batch_args(x, w[0], y, m, n, k, row_bytes);
      const QuantizedMatmulPlan int8 = int8_tiles_plan(a, t->id, FloatType::f16);
      const QuantizedMatmulPlan wmma = tiles_plan(a, t->id, FloatType::f16, false, false);
      void* ws = nullptr;
      if (int8.workspace_bytes) CHECK(cudaMalloc(&ws, int8.workspace_bytes));
      a.workspace = ws;
      auto time_steps = [&](const QuantizedMatmulPlan& p, int first) {
        return timer.us(iters, [&](int i) {
          a.w = w[i % copies];
          for (int s = first; s < p.kMaxSteps && p.steps[s].kernel; ++s) launch(p.steps[s], a);
        });
      };
      const float int8_us = int8.steps[1].kernel ? time_steps(int8, 0) : 0.0f;
      const float tiles_us = int8.steps[1].kernel ? time_steps(int8, 1) : 0.0f;
      const float wmma_us = time_steps(wmma, 0);
      CHECK(cudaDeviceSynchronize());
      std::printf("{\"case\": \"prefill %s\", \"int8_us\": %.1f, \"int8_tiles_us\": %.1f, \"wmma_us\": %.1f, "
                  "\"int8_tops\": %.1f, \"wmma_tops\": %.1f}\n",
                  name.c_str(), int8_us, tiles_us, wmma_us, int8_us > 0 ? 2e-6 * m * n * k / int8_us : 0.0,
                  2e-6 * m * n * k / wmma_us);
      std::fflush(stdout);
      CHECK(cudaFree(x));
      CHECK(cudaFree(y));
      if (ws) CHECK(cudaFree(ws));
      for (auto p : w) CHECK(cudaFree(p));
    }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--check") == 0) return check_all();
  if (argc > 1 && std::strcmp(argv[1], "--prefill") == 0) return prefill(argc > 2 ? argv[2] : "");
  const std::string filter = argc > 1 ? argv[1] : "";
  const int iters = 200;
  const char* bench_types[] = {"Q4_0", "Q4_K", "Q6_K", "Q8_0", "Q4_1", "Q5_K", "IQ4_XS", "Q3_K", "Q2_K"};
  const int ms[] = {1, 2, 3, 4, 5, 6, 8};
  const int64_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
  Timer timer;
  unsigned* sink;
  CHECK(cudaMalloc(&sink, 1 << 20));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"l2_mb\": %.0f}\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1048576.0);
  for (const auto& shape : shapes) {
    const int64_t n = shape[0], k = shape[1];
    for (const char* tname : bench_types) {
      const TypeInfo* t = &type_named(tname);
      const int64_t row_bytes = k / t->qk * t->bytes, bytes = n * row_bytes;
      const std::vector<uint8_t*> w = weight_copies(bytes);
      const int copies = static_cast<int>(w.size());
      uint8_t* dst;
      CHECK(cudaMalloc(&dst, bytes));
      const std::string shape_name = std::to_string(n) + "x" + std::to_string(k);
      bool roofline_done = false;
      for (int m : ms) {
        const std::string name = std::string(tname) + " " + shape_name + " m=" + std::to_string(m);
        if (name.find(filter) == std::string::npos) continue;
        if (!roofline_done) {
          const float copy_us = timer.us(iters, [&](int i) {
            CHECK(cudaMemcpyAsync(dst, w[i % copies], bytes, cudaMemcpyDeviceToDevice));
          });
          const float read_us = timer.us(iters, [&](int i) {
            read_kernel<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4*>(w[i % copies]),
                                                               bytes / 16, sink);
          });
          std::printf("{\"case\": \"roofline %s %s\", \"bytes\": %lld, \"copy_us\": %.2f, \"copy_tbps\": %.3f, "
                      "\"read_us\": %.2f, \"read_tbps\": %.3f}\n",
                      tname, shape_name.c_str(), static_cast<long long>(bytes), copy_us, 2e-6 * bytes / copy_us,
                      read_us, 1e-6 * bytes / read_us);
          roofline_done = true;
        }
        __half* x;
        void* y;
        CHECK(cudaMalloc(&x, m * k * sizeof(__half)));
        CHECK(cudaMalloc(&y, m * n * sizeof(float)));
        fill_half_kernel<<<256, 256>>>(x, m * k);
        QuantizedMatmulArgs a = single_batch_args(x, w[0], y, m, n, k, row_bytes);
        const QuantizedMatmulPlan plan = quantized_matmul_plan(a, t->id, FloatType::f16, false);
        void* ws = nullptr;
        if (plan.workspace_bytes) CHECK(cudaMalloc(&ws, plan.workspace_bytes));
        a.workspace = ws;
        const int steps = plan.steps[1].kernel ? 2 : 1;
        const float plan_us = timer.us(iters, [&](int i) {
          a.w = w[i % copies];
          for (int s = 0; s < steps; ++s) launch(plan.steps[s], a);
        });
        const float step1_us = timer.us(iters, [&](int i) {
          a.w = w[i % copies];
          launch(plan.steps[steps - 1], a);
        });
        CHECK(cudaDeviceSynchronize());
        std::printf("{\"case\": \"%s\", \"weight_bytes\": %lld, \"plan_us\": %.2f, \"step1_us\": %.2f, "
                    "\"step1_tbps\": %.3f, \"grid\": [%u, %u], \"block\": %u}\n",
                    name.c_str(), static_cast<long long>(bytes), plan_us, step1_us, 1e-6 * bytes / step1_us,
                    plan.steps[steps - 1].grid.x, plan.steps[steps - 1].grid.y, plan.steps[steps - 1].block.x);
        std::fflush(stdout);
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
        if (ws) CHECK(cudaFree(ws));
      }
      for (auto p : w) CHECK(cudaFree(p));
      CHECK(cudaFree(dst));
    }
  }
  return 0;
}
