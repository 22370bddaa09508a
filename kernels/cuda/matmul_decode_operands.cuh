// The decode kernels' operands (matmul_decode_plans.cuh has the design): x quantized to int8 per 32 elements, by step 0
// (quantize_x_kernel, into the workspace) or inside a one-step kernel (quantize_x_to_shared, into shared memory),
// and where the kernels read x's blocks (GlobalX, SharedX) and their weight rows (weight_row).
#pragma once
#include "kernels/cuda/decode_formats.cuh"
#include "kernels/cuda/matmul_common.cuh"

namespace ggml_ext::cuda {
namespace {

// ------------------------------------------------------------------------------------------------ step 0

constexpr int kQuantizeThreads = 256;  // 8 threads per 32-element x-block, 4 elements each

// The workspace: codes (rows * k bytes), then one record per x-block.
struct XRecord {
  float d;
  int sums;  // low 16 bits: sum of the codes of elements 0..15, high 16 bits: of 16..31 (each |sum| <= 2032)
};
inline int64_t x_rows(const QuantizedMatmulArgs& a) { return a.batches * a.m; }
__host__ __device__ inline int64_t records_offset(const QuantizedMatmulArgs& a) {
  return (a.batches * a.m * a.k + 15) / 16 * 16;
}

__device__ __forceinline__ float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }  // NaN wins

// An x-block's scale from its largest magnitude, and the factor that turns its elements into codes (0 where the
// scale is 0, NaN or infinite: the codes are 0 and the products keep the scale's NaN or infinity).
struct XScale {
  float d, inv;
  __device__ explicit XScale(float amax) : d(amax / 127.0f), inv(d > 0.0f && d <= 3.402823466e38f ? 1.0f / d : 0.0f) {}
  // Four elements' codes (v * inv to the nearest integer, ties to even, |q| <= 127: as the CPU kernel and ggml's
  // x86 quantizer round) as one word, their sum added to `sum`.
  __device__ __forceinline__ uint32_t pack(const float* v, int& sum) const {
    if (inv == 0.0f) return 0u;  // also where an element is NaN or infinite (then so is amax): v * 0 is no code
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = nearest_int(__fmul_rn(v[j], inv));
      sum += q;
      packed |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * j);
    }
    return packed;
  }
  // Finite r (|r| < 2^22) to the nearest integer, ties to even, in one full-rate add: roundf and the float-to-int
  // conversion it replaced run at a quarter of the rate or less, and the fused kernel, which quantizes x in every
  // block, spent 2.5-4 us of an H100's 17-30 us on x (timed with and without quantizing it,
  // bench/results/h100-2026-11-26v-fused-x-cost.json). Floats in [2^23, 2^24) are the integers, so r + 1.5 * 2^23
  // is rounded, and its bits less those of 1.5 * 2^23 are the result.
  static __device__ __forceinline__ int nearest_int(float r) {
    return __float_as_int(__fadd_rn(r, 12582912.0f)) - 0x4B400000;
  }
};

// Four elements of x as floats: one load where x's rows are aligned to them (`vector`), else one at a time.
template <typename T>
__device__ __forceinline__ void load_x4(const T* src, bool vector, float (&v)[4]) {
  if (vector) {
    load(src, v);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = to_float(src[j]);
}

// kByBlock: the codes and records of batch z ordered by x-block, then row of x (for decode_fragment_kernel, whose
// lanes read one x-block of every row of x at once); else by row of x, then x-block (the dp4a kernels, whose
// lanes read consecutive x-blocks of one row).
// Thread t of the step (8 per x-block); every thread of a warp calls it (they shuffle together).
template <typename T, bool kByBlock>
__device__ __forceinline__ void quantize_x_thread(const QuantizedMatmulArgs& a, int64_t t) {
  const int64_t xb = t / 8, blocks = a.batches * a.m * (a.k / 32);
  const int part = static_cast<int>(t % 8);
  const bool valid = xb < blocks;  // no early exit: the 8 threads of an x-block shuffle together
  // Rows of x are contiguous and k % 32 == 0: x-block xb is elements [32 xb, 32 xb + 32) of x.
  const T* src = static_cast<const T*>(a.x) + (valid ? xb : 0) * 32 + part * 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (valid) load_x4(src, aligned(a.x, 4 * sizeof(T)), v);
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = nan_max(amax, fabsf(v[j]));
#pragma unroll
  for (int offset = 1; offset < 8; offset <<= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const XScale scale(amax);
  int sum = 0;
  const uint32_t packed = scale.pack(v, sum);
  // Code sums of the halves (parts 0..3 and 4..7): exact in float.
  float half = static_cast<float>(sum);
  half += __shfl_xor_sync(0xffffffffu, half, 1);
  half += __shfl_xor_sync(0xffffffffu, half, 2);
  const float other = __shfl_xor_sync(0xffffffffu, half, 4);
  if (!valid) return;
  int64_t slot = xb;  // where x-block xb (row-major over batches, rows, x-blocks) is stored
  if constexpr (kByBlock) {
    const int64_t per_row = a.k / 32, per_batch = a.m * per_row;
    const int64_t z = xb / per_batch, i = xb % per_batch / per_row, j = xb % per_row;
    slot = z * per_batch + j * a.m + i;
  }
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  reinterpret_cast<uint32_t*>(ws + slot * 32)[part] = packed;
  if (part == 0) {
    const int s0 = static_cast<int>(half), s1 = static_cast<int>(other);
    reinterpret_cast<XRecord*>(ws + records_offset(a))[slot] = XRecord{scale.d, (s0 & 0xFFFF) | (s1 << 16)};
  }
}
template <typename T, bool kByBlock>
__global__ void __launch_bounds__(kQuantizeThreads) quantize_x_kernel(QuantizedMatmulArgs a) {
  quantize_x_thread<T, kByBlock>(a, static_cast<int64_t>(blockIdx.x) * kQuantizeThreads + threadIdx.x);
}

// An XRecord read as an int2: x-block's scale and the code sums of its halves.
__device__ __forceinline__ void unpack_record(int2 rec, float& d, int& s0, int& s1) {
  d = __int_as_float(rec.x);
  s0 = static_cast<int>(static_cast<int16_t>(rec.y & 0xFFFF));
  s1 = rec.y >> 16;
}

__device__ __forceinline__ decode::XBlock load_x(const uint8_t* codes, const XRecord* records, int64_t xb) {
  decode::XBlock x;
  const uint4* c = reinterpret_cast<const uint4*>(codes + xb * 32);
  x.lo = __ldg(c);
  x.hi = __ldg(c + 1);
  unpack_record(__ldg(reinterpret_cast<const int2*>(records + xb)), x.d, x.s0, x.s1);
  return x;
}

// Weight row n of batch z, clamped to the last row (rows past n are read and nothing is stored for them).
__device__ __forceinline__ const uint8_t* weight_row(const QuantizedMatmulArgs& a, int64_t z, int64_t n) {
  return static_cast<const uint8_t*>(a.w) + (weight_batch(a, z) * a.n + (n < a.n ? n : a.n - 1)) * a.row_bytes;
}
// x's codes and records (step 0's workspace) of batch z.
__device__ __forceinline__ const uint8_t* x_codes(const QuantizedMatmulArgs& a, int64_t z) {
  return static_cast<const uint8_t*>(a.workspace) + z * a.m * a.k;
}
__device__ __forceinline__ const XRecord* x_records(const QuantizedMatmulArgs& a, int64_t z) {
  return reinterpret_cast<const XRecord*>(static_cast<const uint8_t*>(a.workspace) + records_offset(a)) +
         z * a.m * (a.k / 32);
}

// Where the dp4a kernels read x's quantized blocks: step 0's workspace (row i of x's codes and records) ...
struct GlobalX {
  const uint8_t* codes;
  const XRecord* records;
  int64_t k;
  __device__ __forceinline__ decode::XBlock get(int i, int64_t xb) const {
    return load_x(codes + i * k, records + i * (k / 32), xb);
  }
};
// ... or the fused kernel's shared memory (rows of x one after another, `xblocks` x-blocks each): the codes of
// elements 0..15 of every x-block in one plane and of 16..31 in another (lanes reading consecutive x-blocks hit
// distinct banks), then the records.
struct SharedX {
  const uint4* lo;
  const uint4* hi;
  const XRecord* records;
  int xblocks;
  __device__ __forceinline__ decode::XBlock get(int i, int64_t xb) const {
    const int64_t at = static_cast<int64_t>(i) * xblocks + xb;
    decode::XBlock x;
    x.lo = lo[at];
    x.hi = hi[at];
    unpack_record(reinterpret_cast<const int2*>(records)[at], x.d, x.s0, x.s1);
    return x;
  }
};

// The shared memory of x's rows quantized inside a kernel (the fused kernel's planes, the staged kernel's slots):
// 32 code bytes and a record per x-block.
inline unsigned shared_x_bytes(const QuantizedMatmulArgs& a) {
  return static_cast<unsigned>(a.m * a.k / 32 * (32 + sizeof(XRecord)));
}

// Quantizes the `xblocks` x-blocks of x (contiguous) in shared memory, a thread per x-block; store(xb, lo, hi,
// record) puts x-block xb's codes of elements 0..15 and 16..31 and its record where the kernel reads them.
template <typename T, int kUnroll = 2, class Store>
__device__ __forceinline__ void quantize_x_to_shared(const T* x, int xblocks, Store&& store) {
  const bool vector = aligned(x, 4 * sizeof(T));
#pragma unroll kUnroll
  for (int xb = threadIdx.x; xb < xblocks; xb += blockDim.x) {
    const T* src = x + 32 * static_cast<int64_t>(xb);
    float v[8][4];
#pragma unroll
    for (int w = 0; w < 8; ++w) load_x4(src + 4 * w, vector, v[w]);
    float amax = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w)
#pragma unroll
      for (int e = 0; e < 4; ++e) amax = nan_max(amax, fabsf(v[w][e]));
    const XScale scale(amax);
    uint32_t words[8];
    int sums[2] = {0, 0};
#pragma unroll
    for (int w = 0; w < 8; ++w) words[w] = scale.pack(v[w], sums[w / 4]);
    store(xb, uint4{words[0], words[1], words[2], words[3]}, uint4{words[4], words[5], words[6], words[7]},
          XRecord{scale.d, (sums[0] & 0xFFFF) | (sums[1] << 16)});
  }
}

}  // namespace
}  // namespace ggml_ext::cuda
