// The span row dot on AVX-512 VNNI + VBMI (SpanRowDot), for two rows of x or more: x quantized into span
// records, weight spans gathered by byte permutes (SpanPlan), one int32 vector per span and row of x.
#pragma once
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul_activations.h"
#include "kernels/cpu/matmul_block_scales.h"
#include "kernels/cpu/matmul_common.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
// ---------------------------------------------------------------------------------------------------
// Two rows of x or more on AVX-512 VNNI: spans. A span is 256 elements (a 256-element block, eight 32-element
// ones), cut into 16 lanes of S / 16 consecutive elements (a chunk), so one weight scale and one activation
// scale per lane. Register g of a span holds in lane l the elements
// (S / 16) l + 4g .. + 3, for the weights (gathered so by byte permutes) and for the activations (stored in that
// order), so the span's S / 64 dpbusd add into one int32 vector whose lane l is the dot of the whole lane: the
// float conversion and the two scalings come once per span and row of x instead of once per 64 elements (the
// per-row work is what bounds this product on two cores; 128-element spans of Q4_0 were 1.1x slower at m = 8). The activations are stored + 128 (unsigned) and the
// weight codes stay signed (centered for formats with an offset): the 128 * sum(codes) this adds is taken off
// by starting each row's dot from -128 * sum(codes), computed once per span and weight row.
// ---------------------------------------------------------------------------------------------------
template <class Q>
constexpr int kSpan = 256;
// Spans whose registers gather from two windows (SpanPlan::Window::split): Q8_0, eight blocks of 34 bytes.
template <class Q>
constexpr bool kSplitSpan = Q::kQK == 32 && 8 * sizeof(typename Q::B) > 192;

template <int S>
struct SpanRecord {
  uint8_t q[S];    // codes + 128, in span order (register g at q + 64 g)
  float d[16];     // lane l: its activation scale
  float xsum[16];  // lane l: the exact float sum of its x values (what an offset multiplies)
};

// Where element e of a span sits in SpanRecord::q (and in the weight registers).
template <int S>
constexpr int span_position(int e) {
  return 64 * (e % (S / 16) / 4) + 4 * (e / (S / 16)) + e % 4;
}

// Rows of x in span records.
template <int S>
struct SpanRows : RowTiles {
  std::vector<SpanRecord<S>> rec;

  void resize(int64_t rows, int64_t K) {
    const int64_t padded = shape(rows, (K + S - 1) / S);
    SpanRecord<S> zero{};  // x = 0: padding rows and the tail of the last span
    std::memset(zero.q, 128, sizeof zero.q);
    rec.assign(padded * units, zero);
  }
};

template <class Fmt, int S>
void quantize_row(const typename Fmt::T* x, int64_t K, SpanRows<S>& a, int64_t row) {
  constexpr int kLane = S / 16;  // elements per lane
  for (int64_t k0 = 0; k0 < K; k0 += kActBlock) {
    float v[kActBlock];
    int8_t q[kActBlock];
    const float scale = quantize_block<Fmt>(x + k0, std::min<int64_t>(kActBlock, K - k0), v, q);
    SpanRecord<S>& r = a.rec[a.at(row, k0 / S)];
    const int base = static_cast<int>(k0 % S);
    for (int j = 0; j < kActBlock; ++j) r.q[span_position<S>(base + j)] = static_cast<uint8_t>(q[j] + 128);
    for (int l = 0; l < kActBlock / kLane; ++l) {
      r.d[base / kLane + l] = scale;
      r.xsum[base / kLane + l] = fold_sum<kLane>(v + kLane * l);
    }
  }
}

// How a span's register g is gathered from the weight bytes, computed once per type and register from the shared
// layouts: the byte windows holding its low and high parts (up to three 64-byte loads, masked so that no load
// touches bytes past the span's blocks), the permute indices into them, the shifts per 16-bit word. Where the
// bytes of a register span more than three loads (Q8_0: 272 bytes a span), lanes 0..7 and 8..15 come from two
// windows of at most two loads each, blended (split).
struct SpanPlan {
  struct Window {
    int off = 0, len = 0;   // bytes from the span's first block
    uint64_t load[3] = {};  // byte masks of the loads at off, off + 64, off + 128
    uint64_t third = 0;     // lanes whose index points into the third load
    bool split = false;     // lanes 8..15 from the second window: off2, len2, load2 (load: the first one's)
    int off2 = 0, len2 = 0;
    uint64_t load2[2] = {};
  };
  alignas(64) uint8_t lo_idx[64];
  alignas(64) uint16_t lo_shift[32];
  alignas(64) uint8_t hi_idx[64];
  alignas(64) uint16_t hi_shift[32];
  alignas(64) uint8_t hi_bit[64];  // hi_word formats: the bit of the gathered byte that holds each element's
  Window lo, hi;
  uint8_t lo_mask, hi_mask, hi_pos;
  bool hi_word, has_hi, lo_signed;
  int codebook;
  int8_t sub;  // what takes the format's unsigned part to the (centered) signed code
};

template <class Q, bool kOffset>
constexpr SpanPlan make_span_plan(int g) {
  constexpr int S = kSpan<Q>;
  SpanPlan p{};
  // byte b of the register: element (S / 16) (b / 4) + 4 g + b % 4 of the span, in chunk e / 16 at e % 16
  auto element = [&](int b) { return S / 16 * (b / 4) + 4 * g + b % 4; };
  auto layout = [&](int b) { return group_chunk_layout<Q>(0, element(b) / 16); };
  auto load_masks = [](int len, uint64_t* masks, int n_loads) {
    for (int k = 0; k < n_loads; ++k) {
      const int n = std::clamp(len - 64 * k, 0, 64);
      masks[k] = n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
    }
  };
  // at: each byte's offset from the span's first block; idx gets it relative to its window.
  auto set_window = [&](SpanPlan::Window& w, const int (&at)[64], uint8_t* idx) {
    int lo[2] = {1 << 30, 1 << 30}, hi[2] = {0, 0};  // over lanes 0..7 and 8..15
    for (int b = 0; b < 64; ++b) {
      lo[b / 32] = std::min(lo[b / 32], at[b]);
      hi[b / 32] = std::max(hi[b / 32], at[b] + 1);
    }
    if (std::max(hi[0], hi[1]) - std::min(lo[0], lo[1]) > 192) {
      w.split = true;
      w.off = lo[0], w.len = hi[0] - lo[0];
      w.off2 = lo[1], w.len2 = hi[1] - lo[1];
      load_masks(w.len, w.load, 2);
      load_masks(w.len2, w.load2, 2);
      for (int b = 0; b < 64; ++b) idx[b] = static_cast<uint8_t>(at[b] - lo[b / 32]);
      return;
    }
    w.off = std::min(lo[0], lo[1]);
    w.len = std::max(hi[0], hi[1]) - w.off;
    load_masks(w.len, w.load, 3);
    for (int b = 0; b < 64; ++b) {
      idx[b] = static_cast<uint8_t>(at[b] - w.off);
      if (idx[b] >= 128) w.third |= uint64_t(1) << b;
    }
  };
  int at[64];
  for (int b = 0; b < 64; ++b) {
    const ggml_ext_layout16 l = layout(b);
    at[b] = l.lo + element(b) % 16;
    p.lo_shift[b / 2] = static_cast<uint16_t>(l.lo_shift);
  }
  set_window(p.lo, at, p.lo_idx);
  const ggml_ext_layout16 l0 = layout(0);
  p.has_hi = l0.hi_mask != 0 || l0.hi_word;
  p.hi_word = l0.hi_word;
  if (p.has_hi) {
    for (int b = 0; b < 64; ++b) {
      const ggml_ext_layout16 l = layout(b);
      const int pos = element(b) % 16;
      // hi_word: bit (hi_shift + pos) of the little-endian word at hi
      at[b] = l.hi_word ? l.hi + (l.hi_shift + pos) / 8 : l.hi + pos;
      p.hi_bit[b] = static_cast<uint8_t>(1u << ((l.hi_shift + pos) % 8));
      p.hi_shift[b / 2] = static_cast<uint16_t>(l.hi_word ? 0 : l.hi_shift);
    }
    set_window(p.hi, at, p.hi_idx);
  }
  p.lo_mask = static_cast<uint8_t>(l0.lo_mask);
  p.hi_mask = static_cast<uint8_t>(l0.hi_mask);
  p.hi_pos = static_cast<uint8_t>(l0.hi_pos);
  p.lo_signed = l0.lo_signed != 0;
  p.codebook = l0.codebook;
  p.sub = static_cast<int8_t>(l0.zero + code_center<Q, kOffset>());
  return p;
}

template <class Q, bool kOffset, int G>
inline constexpr SpanPlan kSpanPlan = make_span_plan<Q, kOffset>(G);

// The window's bytes picked by idx: one permute per 64-byte load.
template <const SpanPlan::Window& W>
inline __attribute__((always_inline)) __m512i gather_window(const uint8_t* base, __m512i idx) {
  if constexpr (W.split) {
    static_assert(W.len <= 128 && W.len2 <= 128, "a split register gathers each half from at most two loads");
    const uint8_t *p = base + W.off, *q = base + W.off2;
    const __m512i first = _mm512_permutex2var_epi8(_mm512_maskz_loadu_epi8(W.load[0], p), idx,
                                                   _mm512_maskz_loadu_epi8(W.load[1], p + 64));
    const __m512i second = _mm512_permutex2var_epi8(_mm512_maskz_loadu_epi8(W.load2[0], q), idx,
                                                    _mm512_maskz_loadu_epi8(W.load2[1], q + 64));
    return _mm512_mask_blend_epi8(~uint64_t(0) << 32, first, second);  // bytes 32..63: lanes 8..15
  }
  static_assert(W.len <= 192, "a span's register gathers from at most three 64-byte loads");
  const uint8_t* p = base + W.off;
  if constexpr (W.len <= 64) return _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(W.load[0], p));
  __m512i v = _mm512_permutex2var_epi8(_mm512_maskz_loadu_epi8(W.load[0], p), idx,
                                       _mm512_maskz_loadu_epi8(W.load[1], p + 64));
  if constexpr (W.len > 128) {
    v = _mm512_mask_permutexvar_epi8(v, W.third, idx, _mm512_maskz_loadu_epi8(W.load[2], p + 128));
  }
  return v;
}

// A span's weight registers: signed codes (centered for formats with an offset), in span order.
template <class Q, bool kOffset>
struct SpanCodes {
  __m512i table = _mm512_broadcast_i32x4((__m128i)codebook_table(Q::layout(0).codebook));  // every 128-bit lane

  template <int G>
  inline __attribute__((always_inline)) vi8x64 decode(const uint8_t* base) const {
    constexpr const SpanPlan& p = kSpanPlan<Q, kOffset, G>;
    // The tables are read where used: hoisted out of the loop, GCC kept them in registers and spilled the
    // accumulators instead (Q6_K: 1.2x slower).
    const SpanPlan* t = &p;
    asm("" : "+r"(t));
    __m512i part = gather_window<p.lo>(base, _mm512_load_si512(t->lo_idx));
    if constexpr (p.lo_signed) return (vi8x64)part;  // Q8_0: the bytes are the codes
    part = _mm512_and_si512(_mm512_srlv_epi16(part, _mm512_load_si512(t->lo_shift)), _mm512_set1_epi8(p.lo_mask));
    if constexpr (p.has_hi) {
      const __m512i hi = gather_window<p.hi>(base, _mm512_load_si512(t->hi_idx));
      if constexpr (p.hi_word) {
        const __mmask64 set = _mm512_test_epi8_mask(hi, _mm512_load_si512(t->hi_bit));
        part = _mm512_mask_add_epi8(part, set, part, _mm512_set1_epi8(static_cast<char>(1 << p.hi_pos)));
      } else {
        const __m512i bits =
            _mm512_and_si512(_mm512_srlv_epi16(hi, _mm512_load_si512(t->hi_shift)), _mm512_set1_epi8(p.hi_mask));
        part = _mm512_or_si512(part, _mm512_slli_epi16(bits, p.hi_pos));
      }
    }
    if constexpr (p.codebook != GGML_EXT_CODEBOOK_NONE) return (vi8x64)_mm512_shuffle_epi8(table, part);
    if constexpr (p.sub != 0) part = _mm512_sub_epi8(part, _mm512_set1_epi8(p.sub));
    return (vi8x64)part;
  }
};

// One span of a weight row as the dot takes it.
template <class Q>
struct SpanWeights {
  static constexpr int kRegs = kSpan<Q> / 64;
  vi8x64 w[kRegs];
  vi32x16 bias;           // -128 * the sum of each lane's codes
  vf32x16 scale, offset;  // per lane (offset with the centering added)

  void finish() {
    __m512i sum = _mm512_setzero_si512();
    for (int g = 0; g < kRegs; ++g) sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(-128), (__m512i)w[g]);
    bias = -(vi32x16)sum;
  }
};

// One weight row against a tile of MR rows of x: res[r] = sum_k W[k] x[r0 + r][k]. (Two weight rows per pass,
// which would read each activation record once for both, measured slower: 16 accumulators and two spans'
// registers do not fit in the 32 vector registers.)
template <class Q, int MR, bool kOffset>
struct SpanRowDot {
  using B = typename Q::B;
  static constexpr int S = kSpan<Q>, kRegs = S / 64;
  static constexpr int kBlocks = S / Q::kQK;  // blocks per span
  static constexpr float kCenter = static_cast<float>(code_center<Q, kOffset>());
  // Accumulators live in run() (as members, GCC stores them back after every step).
  using Acc = vf32x16[MR];
  const SpanRecord<S>* rec;
  int64_t stride;
  const SpanCodes<Q, kOffset>& codes;

  SpanRowDot(const SpanRows<S>& act, int64_t row0, const SpanCodes<Q, kOffset>& span_codes)
      : rec(act.rec.data() + act.tile_start(row0)), stride(act.tile), codes(span_codes) {}

  // One span of the weight row against the tile's records of it.
  static inline __attribute__((always_inline)) void step(Acc& acc, const SpanWeights<Q>& w, const SpanRecord<S>* x) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512i dot = (__m512i)w.bias;
#pragma GCC unroll 4
      for (int g = 0; g < kRegs; ++g) {
        dot = _mm512_dpbusd_epi32(dot, _mm512_loadu_si512(x[r].q + 64 * g), (__m512i)w.w[g]);
      }
      acc[r] += __builtin_convertvector((vi32x16)dot, vf32x16) * load_vec<vf32x16>(x[r].d) * w.scale;
      if constexpr (kOffset) acc[r] += w.offset * load_vec<vf32x16>(x[r].xsum);
    }
  }

  // The span at p (whole blocks).
  inline __attribute__((always_inline)) void load(SpanWeights<Q>& w, const uint8_t* p) const {
    [&]<int... G>(std::integer_sequence<int, G...>) __attribute__((always_inline)) {
      ((w.w[G] = codes.template decode<G>(p)), ...);
    }(std::make_integer_sequence<int, kRegs>{});
    if constexpr (Q::kQK == 32) {
      ggml_ext_scale16 s[kBlocks];
      for (int k = 0; k < kBlocks; ++k) s[k] = Q::scale(reinterpret_cast<const B*>(p + k * sizeof(B)), 0);
      set_block_scales(w, s);
    } else {
      typename ScalesOf<Q>::type sc;
      sc.load_block(reinterpret_cast<const B*>(p));
      w.scale = sc.scale;
      w.offset = sc.offset + sc.scale * kCenter;
    }
    w.finish();
  }

  // 32-element blocks: lane l belongs to block l / 2.
  static inline __attribute__((always_inline)) void set_block_scales(SpanWeights<Q>& w, const ggml_ext_scale16* s) {
    w.scale = block_lanes([&](int k) { return s[k].scale; });
    if constexpr (kOffset) w.offset = block_lanes([&](int k) { return signed_offset(s[k]); }) + w.scale * kCenter;
  }
  template <class Value>
  static inline __attribute__((always_inline)) vf32x16 block_lanes(Value value) {
    static_assert(kBlocks == 8);
    const __m256 v = _mm256_setr_ps(value(0), value(1), value(2), value(3), value(4), value(5), value(6), value(7));
    const __m512i spread = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    return (vf32x16)_mm512_permutexvar_ps(spread, _mm512_castps256_ps512(v));
  }

  // The last blocks of a row of 32-element blocks when fewer than a span remain: copied into a span of zero bytes
  // and decoded as a whole one. The missing blocks add nothing: their activations are zero (the records' padding),
  // which makes each lane's integer dot zero whatever the codes, and their scales and offsets are zero too (a
  // zero block's float16 fields; MXFP4's zero codes are the value 0). Permuting the tail element by element into
  // span order, as before, made Q8_0 2048 x 640 at 256 rows of x take 2.4x the time of 2048 x 768 (Zen 4): the
  // tail is decoded once per weight row and tile of x. The span's loads are masked to its bytes (SpanPlan); the
  // 128 bytes past it are only a margin.
  void load_tail(SpanWeights<Q>& w, const uint8_t* p, int n_blocks) const {
    alignas(64) uint8_t blocks[kBlocks * sizeof(B) + 128] = {};
    std::memcpy(blocks, p, n_blocks * sizeof(B));
    load(w, blocks);
  }

  // Blocks [begin, end) of the weight row (begin a multiple of the span).
  void run(const uint8_t* row, int64_t begin, int64_t end, float* res) {
    Acc acc = {};
    const SpanRecord<S>* x = rec + begin / kBlocks * stride;
    int64_t blk = begin;
    SpanWeights<Q> w;
    for (; blk + kBlocks <= end; blk += kBlocks, x += stride) {
      const uint8_t* p = row + blk * sizeof(B);
      prefetch_ahead<(kBlocks * sizeof(B) + 63) / 64>(p);
      load(w, p);
      step(acc, w, x);
    }
    if constexpr (kBlocks > 1) {
      if (blk < end) {
        load_tail(w, row + blk * sizeof(B), static_cast<int>(end - blk));
        step(acc, w, x);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) res[r] = hsum(acc[r]);  // AVX-512: vf32 is 16 lanes
  }
};
#endif

}  // namespace
}  // namespace ggml_ext::cpu::GGML_EXT_ISA
