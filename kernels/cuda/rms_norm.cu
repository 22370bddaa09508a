// RMSNorm: one block per row. Each thread keeps its first kCached packets (16 bytes each) of x and of the weight
// in registers, undecoded, from the loads to the scaling, so rows of up to kCached * kMaxThreads packets are read
// once; the launch gives each thread kCached packets (all its loads in flight at once, the weight's hidden
// behind the block's reduction), and short rows small blocks, so more rows are resident per SM. H100 4096x4096
// f16 (128 threads of 4 packets): 20.0 us, mx.fast.rms_norm 20.2; 256 threads of 2 packets with the weight read
// after the reduction took 27.6 us (mx.fast 21.5).
#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kCached = 4;
constexpr int kMaxThreads = 512;

// kPack elements per packet: 16 bytes when rows and pointers allow vector access, else 1 element.
template <typename T, int kPack>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(RmsNormArgs a) {
  using P = Packed<kPack, T>;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * a.dim;
  T* y = static_cast<T*>(a.y) + row * a.dim;
  const T* w = a.weight ? static_cast<const T*>(a.weight) + (row / a.rows_per_weight) * a.dim : nullptr;
  const int64_t packets = a.dim / kPack;
  auto packet = [&](int c) { return threadIdx.x + static_cast<int64_t>(c) * blockDim.x; };

  // The fused residual add: x + residual rounded to T is written to `sum` and normed in x's place (a thread reads
  // back only the packets it wrote itself).
  const T* r = a.residual ? static_cast<const T*>(a.residual) + row * a.dim : nullptr;
  T* h = a.residual ? static_cast<T*>(a.sum) + row * a.dim : nullptr;
  auto load_row = [&](P& xp, int64_t p) {
    xp.load(x + p * kPack);
    if (!r) return;
    P rp;
    rp.load(r + p * kPack);
    float v[kPack], rv[kPack];
    xp.to_floats(v);
    rp.to_floats(rv);
#pragma unroll
    for (int j = 0; j < kPack; ++j) v[j] += rv[j];
    store(h + p * kPack, v);
    xp.load(h + p * kPack);
  };
  const T* normed = r ? h : x;  // what the second pass reads again

  P xs[kCached], ws[kCached];
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    if (packet(c) < packets) load_row(xs[c], packet(c));
  }
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    if (w && packet(c) < packets) ws[c].load(w + packet(c) * kPack);
  }
  auto squares = [](const P& p) {
    float v[kPack], s = 0.0f;
    p.to_floats(v);
#pragma unroll
    for (int j = 0; j < kPack; ++j) s += v[j] * v[j];
    return s;
  };
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    if (packet(c) < packets) sum += squares(xs[c]);
  }
  for (int64_t p = packet(kCached); p < packets; p += blockDim.x) {
    P xp;
    load_row(xp, p);
    sum += squares(xp);
  }
  const float scale = 1.0f / sqrtf(block_sum(sum) / static_cast<float>(a.dim) + a.eps);

  auto write = [&](int64_t p, const P& xp, const P& wp) {
    float v[kPack], wv[kPack];
    xp.to_floats(v);
    if (w) wp.to_floats(wv);
#pragma unroll
    for (int j = 0; j < kPack; ++j) v[j] = w ? (v[j] * scale) * wv[j] : v[j] * scale;
    store(y + p * kPack, v);
  };
#pragma unroll
  for (int c = 0; c < kCached; ++c) {
    if (packet(c) < packets) write(packet(c), xs[c], ws[c]);
  }
  for (int64_t p = packet(kCached); p < packets; p += blockDim.x) {
    P xp, wp;
    xp.load(normed + p * kPack);
    if (w) wp.load(w + p * kPack);
    write(p, xp, wp);
  }
}

template <FloatType kType>
KernelLaunch rms_norm_launch_typed(const RmsNormArgs& a) {
  using T = typename Storage<kType>::type;
  constexpr int kPack = 16 / sizeof(T);
  const bool vector = a.dim % kPack == 0 && aligned(a.x, 16) && aligned(a.y, 16) &&
                      (!a.weight || aligned(a.weight, 16)) && (!a.residual || (aligned(a.residual, 16) &&
                                                                               aligned(a.sum, 16)));
  const int64_t packets = vector ? a.dim / kPack : a.dim;
  const int64_t warps = std::min<int64_t>(kMaxThreads / 32, ceil_div(ceil_div(packets, kCached), 32));
  KernelLaunch l;
  l.kernel = vector ? reinterpret_cast<const void*>(&rms_norm_kernel<T, kPack>)
                    : reinterpret_cast<const void*>(&rms_norm_kernel<T, 1>);
  l.grid = dim3(static_cast<unsigned>(a.rows));
  l.block = dim3(static_cast<unsigned>(warps * 32));
  return l;
}

}  // namespace

KernelLaunch rms_norm_launch(const RmsNormArgs& args, FloatType type) {
  GGML_EXT_CUDA_FLOAT_SWITCH(type, kType, return rms_norm_launch_typed<kType>(args));
  return {};
}

}  // namespace ggml_ext::cuda
