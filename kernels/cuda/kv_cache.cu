// A key/value cache update's copies (kernels/common/rows_copy.h): one element per thread in a grid-stride loop,
// moved as a 16- or 32-bit word (the copy converts nothing), one row of blocks per copy. Memory-bound and small at
// decode (a token's keys of every head: a few KB), so nothing cleverer.
#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace ggml_ext::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

__host__ __device__ int64_t elements(const ggml_ext::RowsCopyArgs& a) { return a.batch * a.heads * a.rows * a.dim; }

template <typename Word>
__global__ void rows_copy_kernel(const ggml_ext::RowsCopies copies) {
  const ggml_ext::RowsCopyArgs& a = copies.copy[blockIdx.y];
  const Word* src = static_cast<const Word*>(a.src);
  Word* dst = static_cast<Word*>(a.dst);
  const int64_t total = elements(a);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = i % a.dim, r = (i / a.dim) % a.rows, bh = i / (a.dim * a.rows);
    const int64_t h = bh % a.heads, b = bh / a.heads;
    dst[(bh * a.dst_rows + a.row0 + r) * a.dim + d] =
        src[b * a.strides[0] + h * a.strides[1] + r * a.strides[2] + d * a.strides[3]];
  }
}

}  // namespace

KernelLaunch rows_copy_launch(const ggml_ext::RowsCopies& args) {
  KernelLaunch l;
  const int bytes = args.copy[0].element_bytes;
  if (bytes == 2) l.kernel = reinterpret_cast<const void*>(&rows_copy_kernel<uint16_t>);
  if (bytes == 4) l.kernel = reinterpret_cast<const void*>(&rows_copy_kernel<uint32_t>);
  int64_t most = 1;
  for (int i = 0; i < args.count; ++i) {
    if (args.copy[i].element_bytes != bytes) l.kernel = nullptr;
    most = std::max(most, elements(args.copy[i]));
  }
  const int64_t blocks = (most + kThreads - 1) / kThreads;
  l.grid = dim3(static_cast<unsigned>(std::min(blocks, kMaxBlocks)), static_cast<unsigned>(args.count));
  l.block = dim3(kThreads);
  return l;
}

}  // namespace ggml_ext::cuda
