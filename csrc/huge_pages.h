// Memory for the large copies that every decode step reads in full (the CPU's packed weight rows), on 2 MB pages
// where Linux gives them.
#pragma once
#include "csrc/utils.h"

namespace mlx_ggml_ext {

// A new, unwritten uint8 array of `shape` (`bytes` bytes). On Linux, from 2 MB up, its pages are asked to be 2 MB
// ones (madvise MADV_HUGEPAGE) before they are first written: a decode streams through the packed matrices once
// per token, and with 4 KB pages that is a TLB miss every 4 KB. Measured on a 2-core Zen 4 with transparent huge
// pages on "madvise" (the usual default): the 64 packed products of a Llama 3.2 1B-shaped Q4_0 file read their
// bytes 1.10x faster and its decode ran 1.11x faster (4 alternated processes each; docs/performance.md), while
// loading took 0.8-1.4 s longer (the fresh pages are zeroed at first write). Elsewhere, or where the kernel
// refuses, ordinary pages: a hint, nothing depends on it.
mx::array new_streamed_bytes(const mx::Shape& shape, uint64_t bytes);

}  // namespace mlx_ggml_ext
