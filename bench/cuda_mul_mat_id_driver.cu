// Kernel times of mul_mat_id's plans without MLX: a standalone program linked with kernels/cuda/mul_mat_id.cu, for
// timing its kernels (and their variants) on the GPU machine in seconds, and under Nsight Compute without an MLX
// process around them (inside one, ncu's times of small kernels are not kernel times: docs/performance.md).
//
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -lineinfo -arch=sm_90 -I. -DGGML_EXT_TUNING \
//        bench/cuda_mul_mat_id_driver.cu kernels/cuda/mul_mat_id.cu -o mmid_driver
//   ./mmid_driver [filter]        # JSON lines; filter: a substring of the case names
//   ./mmid_driver --check         # each case against float64 math on the dequantized experts (NMSE)
//   ./mmid_driver --few [filter]  # 3 products per case, no timing: for ncu's kernel-only times
//
// Cases: qwen3-30b-a3b's experts (128 of them, 8 used per token), the gate/up shape (768 x 2048, every slot on the
// token's one row of x) and the down shape (2048 x 768, a row of x per slot), at 1 and 8 tokens, float32 x as the
// models pass it. Each timed product takes other experts (64 id sets drawn in turn) of another copy of the experts
// (>= 256 MB together), so it reads its weights from DRAM, not from the 50 MB L2, as a model's layers would.
// "plan_us": CUDA-event time of 200 products in a row divided by 200, every step of the plan (as the op runs);
// "read_us": the read roofline (read_kernel) over as many bytes as the product's experts hold, in the same run.
// "T=8 same": every token routed to the same 8 experts (the most pairs an expert can have), against random routing.
// Variants (this build's -DGGML_EXT_TUNING, environment variables read by the plan): GGML_EXT_MMID_TWO_LAUNCHES=1
// sends one token through the two launches (x quantized once, then the grouped dot) instead of the one-launch
// kernel; GGML_EXT_MMID_GROUPS=N sets the one-launch kernel's row groups per block
// (kernels/cuda/mul_mat_id_one_launch.cuh); GGML_EXT_MMID_MB=N the pairs per chunk of the dot kernels.
#include <algorithm>
#include <numeric>
#include <random>

#include "bench/cuda_driver_common.cuh"

using namespace ggml_ext::cuda;
using namespace driver;

namespace {

constexpr int kExperts = 128, kUsed = 8, kIdSets = 64;

struct Shape {
  const char* name;
  int64_t n, k;
  bool x_per_slot;  // down: a row of x per slot; gate/up: the token's row for every slot
};
const Shape kShapes[] = {{"gate", 768, 2048, false}, {"down", 2048, 768, true}};

// Ids of `sets` routings of t tokens: each token's kUsed distinct experts of e, as a top-k router picks them (with
// `same`, every token of a set the first token's).
std::vector<int32_t> draw_ids(int sets, int t, int e, uint32_t seed, bool same = false) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids, all(e);
  for (int s = 0; s < sets * t; ++s) {
    if (same && s % t != 0) {
      ids.insert(ids.end(), ids.end() - kUsed, ids.end());
      continue;
    }
    std::iota(all.begin(), all.end(), 0);
    for (int j = 0; j < kUsed; ++j) std::swap(all[j], all[j + rng() % (e - j)]);
    ids.insert(ids.end(), all.begin(), all.begin() + kUsed);
  }
  return ids;
}

MulMatIdArgs args_of(const Shape& s, const TypeInfo& t, int tokens, int e) {
  MulMatIdArgs a{};
  a.t = tokens;
  a.n_used = kUsed;
  a.x_slots = s.x_per_slot ? kUsed : 1;
  a.e = e;
  a.n = s.n;
  a.k = s.k;
  a.row_bytes = s.k / t.qk * t.bytes;
  return a;
}

// The plan's steps on a (its workspace allocated here); false where the plan has no kernel for the type.
struct Plan {
  MulMatIdPlan p;
  void* workspace = nullptr;
  Plan(MulMatIdArgs& a, int type) : p(mul_mat_id_plan(a, type, FloatType::f32, false)) {
    if (p.workspace_bytes) CHECK(cudaMalloc(&workspace, p.workspace_bytes));
    a.workspace = workspace;
  }
  ~Plan() {
    if (workspace) cudaFree(workspace);
  }
  int steps() const { return p.steps[1].kernel ? 2 : 1; }
  void run(MulMatIdArgs& a) const {
    for (int s = 0; s < steps(); ++s) launch(p.steps[s], a);
  }
};

std::vector<float> random_x(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(count);
  for (auto& v : x) v = normal(rng);
  return x;
}

// The plan's output against float64 math on the dequantized experts, as NMSE (the GPU suite's bound: 5e-4).
double check_case(const Shape& s, const TypeInfo& t, int tokens, bool same) {
  const int e = 16;  // fewer experts than the timed cases: the reference dequantizes them all
  MulMatIdArgs a = args_of(s, t, tokens, e);
  const std::vector<uint8_t> w = random_weight_bytes(e * a.n * a.row_bytes, 99u + static_cast<uint32_t>(t.id));
  const std::vector<float> x = random_x(tokens * a.x_slots * a.k, 5u);
  const std::vector<int32_t> ids = draw_ids(1, tokens, e, 7u + static_cast<uint32_t>(tokens), same);
  std::vector<float> rows(e * a.n * a.k);
  for (int64_t r = 0; r < e * a.n; ++r) dequantize_row(t, w.data() + r * a.row_bytes, a.k, rows.data() + r * a.k);
  const int64_t pairs = tokens * kUsed;
  std::vector<double> ref(pairs * a.n);
  for (int64_t p = 0; p < pairs; ++p) {
    const float* xr = x.data() + (s.x_per_slot ? p : p / kUsed) * a.k;
    for (int64_t n = 0; n < a.n; ++n) {
      const float* wr = rows.data() + (ids[p] * a.n + n) * a.k;
      double acc = 0.0;
      for (int64_t j = 0; j < a.k; ++j) acc += static_cast<double>(xr[j]) * wr[j];
      ref[p * a.n + n] = acc;
    }
  }
  uint8_t* dw;
  float *dx, *dy;
  int32_t* dids;
  CHECK(cudaMalloc(&dw, w.size()));
  CHECK(cudaMalloc(&dx, x.size() * sizeof(float)));
  CHECK(cudaMalloc(&dy, ref.size() * sizeof(float)));
  CHECK(cudaMalloc(&dids, ids.size() * sizeof(int32_t)));
  CHECK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  a.x = dx;
  a.w = dw;
  a.ids = dids;
  a.y = dy;
  double num = 0.0, den = 0.0;
  {
    const Plan plan(a, t.id);
    plan.run(a);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> y(ref.size());
    CHECK(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < y.size(); ++i) {
      num += (y[i] - ref[i]) * (y[i] - ref[i]);
      den += ref[i] * ref[i];
    }
  }
  CHECK(cudaFree(dw));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dy));
  CHECK(cudaFree(dids));
  return den > 0 ? num / den : num;
}

int check_all() {
  int failures = 0;
  for (const char* tname : {"Q4_0", "Q4_K", "Q8_0", "Q6_K", "IQ4_XS"})
    for (const auto& s : kShapes)
      for (int routing : {1, 3, 8, -3, -8}) {  // tokens; negative: every token on the same experts
        const int tokens = routing < 0 ? -routing : routing;
        const double e = check_case(s, type_named(tname), tokens, routing < 0);
        const bool ok = e <= 5e-4;  // NaN fails too
        failures += !ok;
        std::printf("{\"check\": \"%s %s T=%d%s\", \"nmse\": %.3e, \"ok\": %s}\n", tname, s.name, tokens,
                    routing < 0 ? " same" : "", e, ok ? "true" : "false");
      }
  std::printf("{\"check_failures\": %d}\n", failures);
  return failures == 0 ? 0 : 1;
}

int bench(const std::string& filter, bool few) {
  const int iters = 200;
  Timer timer;
  unsigned* sink;
  CHECK(cudaMalloc(&sink, 1 << 20));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  auto env = [](const char* name) { return std::getenv(name) ? std::getenv(name) : ""; };
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"l2_mb\": %.0f, \"two_launches\": \"%s\", \"groups\": \"%s\", "
              "\"mb\": \"%s\"}\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0,
              env("GGML_EXT_MMID_TWO_LAUNCHES"), env("GGML_EXT_MMID_GROUPS"), env("GGML_EXT_MMID_MB"));
  for (const char* tname : {"Q4_0", "Q4_K", "Q8_0", "Q6_K"})
    for (const auto& s : kShapes)
      for (int routing : {1, 8, -8}) {  // tokens; -8: 8 tokens on the same experts
        const int tokens = routing < 0 ? -routing : routing;
        const TypeInfo& t = type_named(tname);
        const std::string name = std::string(tname) + " " + s.name + " " + std::to_string(s.n) + "x" +
                                 std::to_string(s.k) + " T=" + std::to_string(tokens) + (routing < 0 ? " same" : "");
        if (name.find(filter) == std::string::npos) continue;
        MulMatIdArgs a = args_of(s, t, tokens, kExperts);
        const std::vector<uint8_t*> w = weight_copies(kExperts * a.n * a.row_bytes);
        const std::vector<int32_t> ids = draw_ids(kIdSets, tokens, kExperts, 11u, routing < 0);
        const std::vector<float> x = random_x(tokens * a.x_slots * a.k, 3u);
        float *dx, *dy;
        int32_t* dids;
        CHECK(cudaMalloc(&dx, x.size() * sizeof(float)));
        CHECK(cudaMalloc(&dy, tokens * kUsed * a.n * sizeof(float)));
        CHECK(cudaMalloc(&dids, ids.size() * sizeof(int32_t)));
        CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        a.x = dx;
        a.y = dy;
        const Plan plan(a, t.id);
        auto product = [&](int i) {
          a.w = w[i % w.size()];
          a.ids = dids + (i % kIdSets) * tokens * kUsed;
          plan.run(a);
        };
        if (few) {
          for (int i = 0; i < 3; ++i) product(i);
          CHECK(cudaDeviceSynchronize());
          std::printf("{\"case\": \"%s\", \"few\": 3}\n", name.c_str());
          continue;
        }
        // The bytes of the experts the first id set names (all sets name about as many).
        std::vector<int32_t> first(ids.begin(), ids.begin() + tokens * kUsed);
        std::sort(first.begin(), first.end());
        const int64_t distinct = std::unique(first.begin(), first.end()) - first.begin();
        const int64_t bytes = distinct * a.n * a.row_bytes;
        const float plan_us = timer.us(iters, product);
        const float read_us = timer.us(iters, [&](int i) {
          read_kernel<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4*>(w[i % w.size()]),
                                                             bytes / 16, sink);
        });
        CHECK(cudaDeviceSynchronize());
        const KernelLaunch& last = plan.p.steps[plan.steps() - 1];
        std::printf("{\"case\": \"%s\", \"expert_bytes\": %lld, \"plan_us\": %.2f, \"read_us\": %.2f, "
                    "\"steps\": %d, \"grid\": [%u, %u], \"block\": %u, \"shared\": %u}\n",
                    name.c_str(), static_cast<long long>(bytes), plan_us, read_us, plan.steps(), last.grid.x,
                    last.grid.y, last.block.x, last.shared_bytes);
        std::fflush(stdout);
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dy));
        CHECK(cudaFree(dids));
        for (auto p : w) CHECK(cudaFree(p));
      }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--check") return check_all();
  if (mode == "--few") return bench(argc > 2 ? argv[2] : "", true);
  return bench(mode, false);
}
