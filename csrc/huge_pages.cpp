#include "csrc/huge_pages.h"

#include <cstring>
#include <optional>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace mlx_ggml_ext {
namespace {

constexpr uint64_t kHugePage = uint64_t(2) << 20;

#if defined(__linux__) && defined(MADV_HUGEPAGE)
// The whole 2 MB pages inside [p, p + bytes).
void advise_huge_pages(uint8_t* p, uint64_t bytes) {
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}
#endif

#if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MLX_GGML_EXT_BACKEND_CPU)
// MLX's CPU allocator hands out memory freed before (glibc's heap serves requests below its mmap threshold, which
// rises to 32 MB once a large block is freed, as loading a model does), and pages already written stay 4 KB ones:
// the advice would miss most of a model's matrices. So the copy gets a mapping of its own, its data on a 2 MB
// boundary with the size header that MLX's CPU buffers carry right before their data (the layout
// csrc/mapped_file.cpp probes and relies on too); probed here the same way, nullopt if this MLX differs.
std::optional<mx::array> on_own_pages(const mx::Shape& shape, uint64_t bytes) {
  const uint64_t span = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  const size_t length = span + kHugePage;  // room to start the data on a 2 MB boundary after the header
  void* region = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return std::nullopt;
  const uintptr_t start = reinterpret_cast<uintptr_t>(region) + sizeof(size_t);
  auto* data = reinterpret_cast<uint8_t*>((start + kHugePage - 1) & ~(kHugePage - 1));
  madvise(data, span, MADV_HUGEPAGE);
  const size_t header = bytes;
  std::memcpy(data - sizeof(size_t), &header, sizeof header);
  mx::array out = array_over_buffer(mx::allocator::Buffer{data - sizeof(size_t)},
                                    [region, length](mx::allocator::Buffer) { munmap(region, length); }, 0, shape,
                                    bytes);
  if (out.data<uint8_t>() != data) return std::nullopt;  // out's release unmaps the region
  return out;
}
#endif

}  // namespace

mx::array new_streamed_bytes(const mx::Shape& shape, uint64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MLX_GGML_EXT_BACKEND_CPU)
  if (bytes >= kHugePage) {
    if (auto out = on_own_pages(shape, bytes)) return *out;
  }
#endif
  mx::array out(mx::allocator::malloc(bytes), shape, mx::uint8);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  advise_huge_pages(out.data<uint8_t>(), bytes);  // nothing below 2 MB: no whole 2 MB page inside
#endif
  return out;
}

}  // namespace mlx_ggml_ext
