// Quantize: one block at a time, threads over runs of blocks.
//
// Legacy types and MXFP4 follow gguf.quants (and ggml's *_ref C code) operation by operation in float32, so
// the bytes match: the scale from the block's extreme value, the reciprocal id = 1/d, quants from
// trunc(x*id + offset) or round-half-away(x*id), the scale stored as float16 (round to nearest even). Built
// with -ffp-contract=off (cmake/cpu_variants.cmake): x*id + 8.5f must round twice.
//
// Two rules where gguf's result is undefined behaviour (a float->uint8 cast of inf/NaN or of a negative
// value, which x86 wraps and ARM saturates):
//   - when 1/d overflows (|d| < 2^-128: every |x| < about 2^-125) the quants are the zero point (the f16 scale
//     is 0 there, so the block decodes to zeros or to its min, as gguf's would);
//   - MXFP4's exponent is clamped at 0 for max |x| < 2^-125 (gguf wraps it to 251..255).
// A block holding NaN or +-inf: see quantize.h.
//
// K-quants (Q2_K .. Q6_K) and IQ4_NL / IQ4_XS: this package's own least-squares scale searches
// (quantize_search.h), minimizing the squared reconstruction error, weighted per element by the importance
// matrix when one is given.
#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/common/ggml_blocks.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quantize_search.h"
#include "kernels/cpu/simd.h"

namespace ggml_ext::cpu {
namespace GGML_EXT_ISA {
namespace {

constexpr uint16_t kHalfNaN = 0x7E00;
constexpr int64_t kGrainElements = 8192;

bool all_finite(const float* x, int n) {
  uint32_t non_finite = 0;
  for (int i = 0; i < n; ++i) non_finite |= (ggml_ext_f32_to_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
  return non_finite == 0;
}


// ------------------------------------------------------------------------------------------------ legacy

// The first value of largest magnitude, with its sign (numpy's argmax of |x|).
float signed_absmax(const float* x) {
  float best = x[0], amax = std::fabs(x[0]);
  for (int i = 1; i < GGML_EXT_QK32; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      best = x[i];
    }
  }
  return best;
}

// Q4_0/Q5_0: d = max / -2^(bits-1), q = min(2^bits - 1, trunc(x*id + 2^(bits-1) + 0.5)).
template <int kBits>
uint16_t quantize_symmetric(const float* x, int* q) {
  constexpr int kHalf = 1 << (kBits - 1);
  const float d = signed_absmax(x) / static_cast<float>(-kHalf);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float offset = static_cast<float>(kHalf) + 0.5f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    q[i] = std::isinf(id) ? kHalf : std::min(2 * kHalf - 1, static_cast<int>(x[i] * id + offset));
  }
  return ggml_ext_fp32_to_fp16(d);
}

// Q4_1/Q5_1: d = (max - min) / (2^bits - 1), q = min(2^bits - 1, trunc((x - min)*id + 0.5)).
template <int kBits>
void quantize_affine(const float* x, uint16_t* d_out, uint16_t* m_out, int* q) {
  constexpr int kMax = (1 << kBits) - 1;
  float lo = x[0], hi = x[0];
  for (int i = 1; i < GGML_EXT_QK32; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  const float d = (hi - lo) / static_cast<float>(kMax);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    q[i] = std::isinf(id) ? 0 : std::min(kMax, static_cast<int>((x[i] - lo) * id + 0.5f));
  }
  *d_out = ggml_ext_fp32_to_fp16(d);
  *m_out = ggml_ext_fp32_to_fp16(lo);
}

// Byte j holds element j (low nibble) and element j + 16 (high nibble); the 5th bits go to a u32.
void pack_nibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
}
void pack_fifth_bits(const int* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < GGML_EXT_QK32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(bits >> (8 * k));
}

void quantize_block(const float* x, block_q4_0* y) {
  int q[GGML_EXT_QK32];
  y->d = quantize_symmetric<4>(x, q);
  pack_nibbles(q, y->qs);
}
void quantize_block(const float* x, block_q5_0* y) {
  int q[GGML_EXT_QK32];
  y->d = quantize_symmetric<5>(x, q);
  pack_nibbles(q, y->qs);
  pack_fifth_bits(q, y->qh);
}
void quantize_block(const float* x, block_q4_1* y) {
  int q[GGML_EXT_QK32];
  quantize_affine<4>(x, &y->d, &y->m, q);
  pack_nibbles(q, y->qs);
}
void quantize_block(const float* x, block_q5_1* y) {
  int q[GGML_EXT_QK32];
  quantize_affine<5>(x, &y->d, &y->m, q);
  pack_nibbles(q, y->qs);
  pack_fifth_bits(q, y->qh);
}

// Q8_0: d = max|x| / 127, q = round-half-away(x*id).
void quantize_block(const float* x, block_q8_0* y) {
  float amax = 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    y->qs[i] = std::isinf(id) ? 0 : static_cast<int8_t>(std::round(x[i] * id));
  }
  y->d = ggml_ext_fp32_to_fp16(d);
}

// MXFP4: e = floor(log2(max|x|)) - 2 + 127 with float32's log2 (correctly rounded: double, then rounded to
// float), then per element the first code of least |d*value - x|.
void quantize_block(const float* x, block_mxfp4* y) {
  float amax = 0.0f;
  for (int i = 0; i < GGML_EXT_QK32; ++i) amax = std::max(amax, std::fabs(x[i]));
  int e = 0;
  if (amax > 0.0f) {
    const float log2_amax = static_cast<float>(std::log2(static_cast<double>(amax)));
    e = std::max(0, static_cast<int>(std::floor(log2_amax) - 2.0f + 127.0f));
  }
  const float d = ggml_ext_e8m0_half_to_float(static_cast<uint32_t>(e));
  int q[GGML_EXT_QK32];
  for (int i = 0; i < GGML_EXT_QK32; ++i) {
    int best = 0;
    float best_err = std::fabs(d * static_cast<float>(ggml_ext_mxfp4_value(0)) - x[i]);
    for (int k = 1; k < 16; ++k) {
      const float err = std::fabs(d * static_cast<float>(ggml_ext_mxfp4_value(k)) - x[i]);
      if (err < best_err) {
        best_err = err;
        best = k;
      }
    }
    q[i] = best;
  }
  y->e = static_cast<uint8_t>(e);
  pack_nibbles(q, y->qs);
}

// ------------------------------------------------------------------------------------------------ K-quants, IQ4

// The 12 scale bytes of Q4_K/Q5_K (inverse of ggml_ext_k4_scale / ggml_ext_k4_min).
void pack_k4_scales(const int* sc, const int* mc, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>(mc[j] | ((mc[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mc[j + 4] & 0xF) << 4));
  }
}

void quantize_block(const float* x, const float* w, block_q4_k* y) {
  SubBlock<2> subs[8];
  load_sub_blocks(x, w, subs);
  int sc[8], mc[8], L[256];
  quantize_affine_block<8, 2, 15, 63>(subs, &y->d, &y->dmin, sc, mc, L);
  pack_k4_scales(sc, mc, y->scales);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) y->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_block(const float* x, const float* w, block_q5_k* y) {
  SubBlock<2> subs[8];
  load_sub_blocks(x, w, subs);
  int sc[8], mc[8], L[256];
  quantize_affine_block<8, 2, 31, 63>(subs, &y->d, &y->dmin, sc, mc, L);
  pack_k4_scales(sc, mc, y->scales);
  std::memset(y->qh, 0, sizeof y->qh);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
      y->qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      y->qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
}

// Q2_K / Q3_K: per half h of 128, byte qs[32h + l] holds the 2-bit codes of elements 128h + 32t + l at bit 2t.
void pack_two_bit_codes(const int* q, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* e = q + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>((e[0] & 3) | ((e[32] & 3) << 2) | ((e[64] & 3) << 4) | ((e[96] & 3) << 6));
    }
  }
}

// Q2_K: 16 sub-blocks of 16, 4-bit scale and min, levels 0..3.
void quantize_block(const float* x, const float* w, block_q2_k* y) {
  SubBlock<1> subs[16];
  load_sub_blocks(x, w, subs);
  int sc[16], mc[16], L[256];
  quantize_affine_block<16, 1, 3, 15>(subs, &y->d, &y->dmin, sc, mc, L);
  for (int j = 0; j < 16; ++j) y->scales[j] = static_cast<uint8_t>(sc[j] | (mc[j] << 4));
  pack_two_bit_codes(L, y->qs);
}

// Q3_K: 16 sub-blocks of 16, signed 6-bit scales stored + 32, codes -4..3 stored as 2 low bits plus a high
// bit that is set for codes >= 0 (the decoder subtracts 4 where it is clear).
void quantize_block(const float* x, const float* w, block_q3_k* y) {
  SubBlock<1> subs[16];
  load_sub_blocks(x, w, subs);
  int sc[16], q[256];  // q = code + 4, 0..7
  y->d = quantize_symmetric_block<UniformGrid<4>, 16, 1, -32, 31>(subs, sc, q);
  std::memset(y->scales, 0, sizeof y->scales);
  for (int s = 0; s < 16; ++s) {
    const int v = sc[s] + 32;
    y->scales[s % 8] |= static_cast<uint8_t>((v & 0xF) << (s < 8 ? 0 : 4));
    y->scales[8 + s % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (s / 4)));
  }
  std::memset(y->hmask, 0, sizeof y->hmask);
  for (int e = 0; e < 256; ++e) y->hmask[e % 32] |= static_cast<uint8_t>((q[e] >> 2) << (e / 32));
  pack_two_bit_codes(q, y->qs);
}

// Q6_K: 16 sub-blocks of 16, int8 scales, codes -32..31 stored + 32.
void quantize_block(const float* x, const float* w, block_q6_k* y) {
  SubBlock<1> subs[16];
  load_sub_blocks(x, w, subs);
  int sc[16], q[256];
  y->d = quantize_symmetric_block<UniformGrid<32>, 16, 1, -128, 127>(subs, sc, q);
  for (int j = 0; j < 16; ++j) y->scales[j] = static_cast<int8_t>(sc[j]);
  // Per 128-element half h, element 32*s + l: low nibble in ql[64h + l + 32*(s&1)] (high nibble for s >= 2),
  // two high bits at 2*s of qh[32h + l].
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* e = q + 128 * h + l;
      y->ql[64 * h + l] = static_cast<uint8_t>((e[0] & 0xF) | ((e[64] & 0xF) << 4));
      y->ql[64 * h + 32 + l] = static_cast<uint8_t>((e[32] & 0xF) | ((e[96] & 0xF) << 4));
      y->qh[32 * h + l] = static_cast<uint8_t>((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) | ((e[96] >> 4) << 6));
    }
  }
}

// IQ4_NL: one float16 scale for 32 values on the non-linear grid.
void quantize_block(const float* x, const float* w, block_iq4_nl* y) {
  SubBlock<2> subs[1];
  load_sub_blocks(x, w, subs);
  int sc[1], q[32];
  y->d = quantize_symmetric_block<NonlinearGrid, 1, 2, 1, 1>(subs, sc, q);
  pack_nibbles(q, y->qs);
}

// IQ4_XS: 8 sub-blocks of 32 on the non-linear grid, signed 6-bit scales stored + 32 (4 low bits in
// scales_l, 2 high bits in scales_h).
void quantize_block(const float* x, const float* w, block_iq4_xs* y) {
  SubBlock<2> subs[8];
  load_sub_blocks(x, w, subs);
  int sc[8], q[256];
  y->d = quantize_symmetric_block<NonlinearGrid, 8, 2, -32, 31>(subs, sc, q);
  std::memset(y->scales_l, 0, sizeof y->scales_l);
  uint16_t high = 0;
  for (int j = 0; j < 8; ++j) {
    const int v = sc[j] + 32;
    y->scales_l[j / 2] |= static_cast<uint8_t>((v & 0xF) << (4 * (j % 2)));
    high |= static_cast<uint16_t>((v >> 4) << (2 * j));
  }
  y->scales_h = high;
  for (int j = 0; j < 8; ++j) pack_nibbles(q + 32 * j, y->qs + 16 * j);
}
// ------------------------------------------------------------------------------------------------ non-finite

// Every float16 scale NaN: each element decodes to NaN.
template <class Block>
void poison_block(Block* y) {
  std::memset(y, 0, sizeof *y);
  y->d = kHalfNaN;
  if constexpr (requires { y->m; }) y->m = kHalfNaN;
  if constexpr (requires { y->dmin; }) y->dmin = kHalfNaN;
}
// E8M0 0xFF (OCP MX's NaN) with code 12: ggml decodes 12 * 2^127 = +inf.
template <>
void poison_block(block_mxfp4* y) {
  y->e = 0xFF;
  std::memset(y->qs, 0x77, sizeof y->qs);
}

// ------------------------------------------------------------------------------------------------ driver

// Error weights of one block from the importance matrix: negative or non-finite entries count as 0 (the op
// rejects them; this keeps the kernel total), scaled to mean 1 over the block (the searches only compare
// errors within a block, and this keeps the sums in range), and a run of 16 whose weights are all zero weighs
// its elements equally (nothing there to prefer: the plain error).
void block_weights(const float* imatrix, int n, float* w) {
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const float v = imatrix[i];
    w[i] = std::isfinite(v) && v > 0.0f ? v : 0.0f;
    sum += w[i];
  }
  for (int i = 0; i < n; ++i) w[i] = sum > 0 ? static_cast<float>(w[i] * (n / sum)) : 1.0f;
  for (int g = 0; g < n; g += 16) {
    if (std::all_of(w + g, w + g + 16, [](float v) { return v == 0.0f; })) std::fill(w + g, w + g + 16, 1.0f);
  }
}

// The K-quants and IQ4 types take error weights; the byte-exact types follow gguf and take none.
template <class Block>
constexpr bool kWeighted = requires(const float* p, Block* b) { quantize_block(p, p, b); };

template <class In, class Block, int QK>
void quantize_blocks(const QuantizeArgs& a, int64_t begin, int64_t end) {
  const auto* x = static_cast<const typename In::T*>(a.x);
  auto* y = static_cast<Block*>(a.blocks);
  float v[QK], w[QK];
  std::fill(w, w + QK, 1.0f);
  const int64_t blocks_per_row = a.imatrix != nullptr ? a.row_length / QK : 1;
  for (int64_t i = begin; i < end; ++i) {
    for (int k = 0; k < QK; k += kLanes) F32::store(v + k, In::load(x + i * QK + k));
    if (!all_finite(v, QK)) {
      poison_block(y + i);
    } else if constexpr (kWeighted<Block>) {
      if (a.imatrix != nullptr) block_weights(a.imatrix + (i % blocks_per_row) * QK, QK, w);
      quantize_block(v, w, y + i);
    } else {
      quantize_block(v, y + i);
    }
  }
}

template <class In, class Block, int QK>
void run_blocks(const QuantizeArgs& a) {
  parallel_for(a.n_blocks, std::max<int64_t>(1, kGrainElements / QK),
               [&](int64_t b, int64_t e) { quantize_blocks<In, Block, QK>(a, b, e); });
}

template <class Out, class In>
void run_convert(const QuantizeArgs& a) {
  const auto* x = static_cast<const typename In::T*>(a.x);
  auto* y = static_cast<typename Out::T*>(a.blocks);
  parallel_for(a.n_blocks, 4 * kGrainElements, [&](int64_t b, int64_t e) { convert_floats<Out, In>(x, y, b, e); });
}

template <class In>
void quantize_from(const QuantizeArgs& a) {
  switch (a.type) {
    case GGML_EXT_TYPE_F32: return run_convert<F32, In>(a);
    case GGML_EXT_TYPE_F16: return run_convert<F16, In>(a);
    case GGML_EXT_TYPE_BF16: return run_convert<BF16, In>(a);
    case GGML_EXT_TYPE_Q4_0: return run_blocks<In, block_q4_0, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q4_1: return run_blocks<In, block_q4_1, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q5_0: return run_blocks<In, block_q5_0, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q5_1: return run_blocks<In, block_q5_1, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q8_0: return run_blocks<In, block_q8_0, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_MXFP4: return run_blocks<In, block_mxfp4, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_Q2_K: return run_blocks<In, block_q2_k, GGML_EXT_QK_K>(a);
    case GGML_EXT_TYPE_Q3_K: return run_blocks<In, block_q3_k, GGML_EXT_QK_K>(a);
    case GGML_EXT_TYPE_Q4_K: return run_blocks<In, block_q4_k, GGML_EXT_QK_K>(a);
    case GGML_EXT_TYPE_Q5_K: return run_blocks<In, block_q5_k, GGML_EXT_QK_K>(a);
    case GGML_EXT_TYPE_Q6_K: return run_blocks<In, block_q6_k, GGML_EXT_QK_K>(a);
    case GGML_EXT_TYPE_IQ4_NL: return run_blocks<In, block_iq4_nl, GGML_EXT_QK32>(a);
    case GGML_EXT_TYPE_IQ4_XS: return run_blocks<In, block_iq4_xs, GGML_EXT_QK_K>(a);
    default: return;  // the primitive validated the type
  }
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  GGML_EXT_FLOAT_SWITCH(a.in_type, In, quantize_from<In>(a));
}

}  // namespace GGML_EXT_ISA

GGML_EXT_DISPATCH(quantize, QuantizeArgs)

}  // namespace ggml_ext::cpu
