#include "csrc/kv_cache.h"

#include <algorithm>
#include <limits>

#include "mlx/transforms.h"

namespace mlx_ggml_ext {
namespace {

constexpr const char* kOp = "kv_cache_append";

// Everything but the dtypes, which only the op checks (the node's inputs keep them).
void check_shapes(const mx::array& cache, const mx::array& rows, int offset) {
  for (const auto& [name, a] : {std::pair{"cache", &cache}, std::pair{"rows", &rows}}) {
    if (a->ndim() != 4) {
      throw std::invalid_argument(cat("[", kOp, "] ", name, " must be 4-D (batch, heads, rows, head_dim), got shape ",
                                      shape_str(a->shape()), "."));
    }
  }
  if (rows.shape(0) != cache.shape(0) || rows.shape(1) != cache.shape(1) || rows.shape(3) != cache.shape(3)) {
    throw std::invalid_argument(cat("[", kOp, "] rows must share batch, heads and head_dim with the cache (cache ",
                                    shape_str(cache.shape()), ", rows ", shape_str(rows.shape()), ")."));
  }
  if (offset < 0 || offset > cache.shape(2)) {
    throw std::invalid_argument(cat("[", kOp, "] offset must be in [0, ", cache.shape(2), "] for a cache of shape ",
                                    shape_str(cache.shape()), ", got ", offset, "."));
  }
  if (static_cast<int64_t>(offset) + rows.shape(2) > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(cat("[", kOp, "] offset ", offset, " + ", rows.shape(2), " rows overflows int32."));
  }
}

mx::Shape output_shape(const mx::array& cache, const mx::array& rows, int offset) {
  return {cache.shape(0), cache.shape(1), offset + rows.shape(2), cache.shape(3)};
}

// The same array from MLX's ops: the primitive's transformations.
GraphFn unfused(int offset, mx::Stream s) {
  return [offset, s](const std::vector<mx::array>& in) {
    const auto& cache = in[0];
    mx::Shape stop = cache.shape();
    stop[2] = offset;
    const auto kept = mx::slice(cache, mx::Shape{0, 0, 0, 0}, stop, s);
    return std::vector<mx::array>{mx::concatenate({kept, mx::astype(in[1], cache.dtype(), s)}, 2, s)};
  };
}

// Rows per (batch, head) of the cache's buffer where the op may write into it: the cache donatable, laid out as
// (B, H, capacity, D) from its buffer's start (size-1 axes' strides as its producer left them), with room for
// `needed` rows inside the buffer. 0 where not.
int64_t capacity_in_place(const mx::array& cache, int64_t needed) {
  if (!cache.is_donatable() || cache.offset() != 0 || cache.size() == 0) return 0;
  const auto& st = cache.strides();
  const int64_t B = cache.shape(0), H = cache.shape(1), R = cache.shape(2), D = cache.shape(3);
  if ((D > 1 && st[3] != 1) || (R > 1 && st[2] != D)) return 0;
  int64_t capacity = R;
  if (H > 1 || B == 1) {
    if (st[1] % D == 0 && st[1] / D >= R) capacity = st[1] / D;
    else if (H > 1) return 0;
  } else if (st[0] % D == 0 && st[0] / D >= R) {
    capacity = st[0] / D;
  } else {
    return 0;
  }
  if (B > 1 && st[0] != H * capacity * D) return 0;
  if (capacity < needed || static_cast<size_t>(B * H * capacity * D) * cache.itemsize() > cache.buffer_size()) {
    return 0;
  }
  return capacity;
}

}  // namespace

mx::array kv_cache_append(const mx::array& cache, const mx::array& rows, int offset, int step, mx::StreamOrDevice s) {
  check_float_dtype(cache, kOp, "cache");
  check_float_dtype(rows, kOp, "rows");
  if (step <= 0) throw std::invalid_argument(cat("[", kOp, "] step must be > 0, got ", step, "."));
  check_shapes(cache, rows, offset);
  const auto stream = mx::to_stream(s);
  return mx::array(output_shape(cache, rows, offset), cache.dtype(),
                   std::make_shared<KVCacheAppend>(stream, offset, step),
                   {cache, mx::astype(rows, cache.dtype(), stream)});
}

std::vector<mx::Shape> KVCacheAppend::output_shapes(const std::vector<mx::array>& inputs) {
  check_shapes(inputs[0], inputs[1], offset_);
  return {output_shape(inputs[0], inputs[1], offset_)};
}

bool KVCacheAppend::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const KVCacheAppend&>(other);
  return offset_ == o.offset_ && step_ == o.step_;
}

std::vector<mx::array> KVCacheAppend::vjp(const std::vector<mx::array>& primals,
                                          const std::vector<mx::array>& cotangents, const std::vector<int>& argnums,
                                          const std::vector<mx::array>&) {
  return vjp_through(unfused(offset_, stream()), primals, cotangents, argnums);
}

std::vector<mx::array> KVCacheAppend::jvp(const std::vector<mx::array>& primals,
                                          const std::vector<mx::array>& tangents, const std::vector<int>& argnums) {
  return jvp_through(unfused(offset_, stream()), primals, tangents, argnums, stream());
}

std::pair<std::vector<mx::array>, std::vector<int>> KVCacheAppend::vmap(const std::vector<mx::array>& inputs,
                                                                        const std::vector<int>& axes) {
  return {mx::vmap(unfused(offset_, stream()), axes, {0})(inputs), {0}};
}

std::vector<ggml_ext::RowsCopyArgs> KVCacheAppend::place(const std::vector<mx::array>& inputs, mx::array& out,
                                                         void* (*data)(const mx::array&)) const {
  const auto &cache = inputs[0], &rows = inputs[1];
  const int64_t B = out.shape(0), H = out.shape(1), D = out.shape(3), needed = out.shape(2);
  int64_t capacity = capacity_in_place(cache, needed);
  const bool in_place = capacity > 0;
  mx::array buffer = cache;
  if (!in_place) {  // MLX's allocator: owned memory, which MLX lets the next call take over
    capacity = std::max<int64_t>((needed + step_ - 1) / step_ * step_, 1);
    buffer = mx::array(mx::Shape{static_cast<int>(B), static_cast<int>(H), static_cast<int>(capacity),
                                 static_cast<int>(D)},
                       out.dtype(), nullptr, {});
    buffer.set_data(mx::allocator::malloc(buffer.nbytes()));
  }
  const mx::Strides strides = {H * capacity * D, capacity * D, D, 1};
  size_t data_size = out.size() == 0 ? 0 : 1;
  for (int i = 0; i < 4 && data_size > 0; ++i) data_size += (out.shape(i) - 1) * strides[i];
  out.copy_shared_buffer(buffer, strides, view_flags(out.shape(), strides, data_size), data_size, 0);
  std::vector<ggml_ext::RowsCopyArgs> copies;
  auto add = [&](int input, int64_t count, int64_t row0) {
    const mx::array& src = inputs[input];
    if (count == 0 || B * H * D == 0) return;
    copies.push_back({data(src), data(out), B, H, count, D,
                      {src.strides()[0], src.strides()[1], src.strides()[2], src.strides()[3]}, capacity, row0,
                      static_cast<int>(out.itemsize()), input});
  };
  if (!in_place) add(0, offset_, 0);
  add(1, rows.shape(2), offset_);
  return copies;
}

}  // namespace mlx_ggml_ext
