// The decode product's machinery, shared by the decode kernels (decode.metal: x's rows are consecutive) and
// the grouped mul_mat_id (mul_mat_id.metal: x's rows gathered through the pairs sorted by expert): up to
// XRows rows of x against each simdgroup's DecodeShape::rows weight rows, staged in threadgroup memory by
// adjacent aligned words (docs/metal.md, "Decode").
//
// The reduction runs in steps of kStep = 512 elements:
//   1. simdgroup 0 stages the XRows x rows' 512 elements in threadgroup memory, and each simdgroup its
//      weight rows' bytes for those elements, both as adjacent aligned words (up to 16 bytes, the widest the
//      addresses allow) read by adjacent lanes: every device load of the main loop is a coalesced one;
//      weight loads cover whole 128-byte lines (a step's last partial line is staged with the next step's
//      bytes), so each weight byte is requested once per product, and x once per threadgroup;
//   2. lane l decodes the 16-element run l of each of its simdgroup's rows from threadgroup memory (the
//      shared block decoders, kernels/common/ggml_blocks.h: every format decoded as the CPU does) and dots
//      it with the XRows x runs, read into registers once per weight row set.
// Full steps have no bounds checks; the last partial step (K % 512 elements) is handled once, zero-filled
// to whole runs. simd_sum adds the lanes' partial sums at the end.
#pragma once
#include "kernels/metal/decoders.h"

enum {
  kStep = 512,  // elements of the reduction per step: 32 runs of 16, one per lane
  kDecodeSimdgroups = 4,
};

// Weight rows per simdgroup: 4, fewer for the float types, whose staged bytes per row are larger.
template <typename D>
struct DecodeShape {
  enum {
    rows = D::is_float ? (D::block_bytes == 4 ? 1 : 2) : 4,
    span = (kStep / D::block_size) * D::block_bytes,  // bytes of a weight row per step
    row_stage = (span + 16 + 128 + 15) / 16 * 16,      // its threadgroup bytes: + alignment pad + carry
  };
};

// Copies n bytes from device memory to threadgroup memory as words of W bytes, word i by lane i % 32 of
// the simdgroup (adjacent lanes, adjacent words). src, dst and n are multiples of W. Every lane loads in
// every pass, those past the last word that word again (the same line: no extra traffic), so the lanes' loads
// stay one instruction whatever n is: the traffic model pairs the lanes' i-th loads, and rows whose word
// counts differ (Q6_K's 420-byte steps: 24 or 32 words) no longer shift one lane's loads against another's.
template <typename W>
inline void stage_words(threadgroup uchar* dst, device const uchar* src, uint n, uint lane) {
  threadgroup W* d = (threadgroup W*)dst;
  device const W* s = (device const W*)src;
  const uint words = n / sizeof(W);
  for (uint base = 0; base < words; base += 32) {
    const uint i = base + lane;
    const W word = s[min(i, words - 1)];
    if (i < words) d[i] = word;
  }
}

// The widest word (16, 8, 4, 2 or 1 bytes) dividing `alignment` (an OR of the addresses and lengths).
inline void stage_bytes(threadgroup uchar* dst, device const uchar* src, uint n, uint alignment, uint lane) {
  const uint a = alignment | 16u;
  if ((a & 15u) == 0) {
    stage_words<uint4>(dst, src, n, lane);
  } else if ((a & 7u) == 0) {
    stage_words<uint2>(dst, src, n, lane);
  } else if ((a & 3u) == 0) {
    stage_words<uint>(dst, src, n, lane);
  } else if ((a & 1u) == 0) {
    stage_words<ushort>(dst, src, n, lane);
  } else {
    stage_words<uchar>(dst, src, n, lane);
  }
}

inline void zero_bytes(threadgroup uchar* dst, uint from, uint to, uint lane) {
  for (uint i = from + lane; i < to; i += 32) dst[i] = 0;
}

// The first byte at or after row byte p where a 128-byte line starts (row_line: the row's first byte's
// address modulo 128), or the row's end.
inline uint next_line(uint p, uint row_line, uint row_bytes) {
  return min(p + (128u - (row_line + p) % 128u) % 128u, row_bytes);
}

// What one decode product reads: the threadgroup's x rows (each its own address: consecutive rows in
// decode.metal, gathered ones in mul_mat_id.metal) and this simdgroup's consecutive weight rows.
template <int XRows>
struct DecodeOperands {
  device const uchar* x_row[XRows];  // first byte of each x row; rows from x_live on are never read
  uint x_live;                       // x rows that exist (the same for the whole threadgroup)
  uint x_align;                      // an OR of every x row's address modulo 128 and the row length in bytes
  device const uchar* w_row;         // the simdgroup's first weight row
  uint w_live;                       // its rows that exist (the same for the whole simdgroup)
  uint w_line;                       // w_row's address modulo 128
  uint K, row_bytes;
};

// Threadgroup bytes the product needs (the host's plans compute the same: launch_plans.h).
template <typename D, typename T, int XRows>
constexpr uint decode_stage_bytes() {
  return XRows * kStep * sizeof(T) + kDecodeSimdgroups * DecodeShape<D>::rows * DecodeShape<D>::row_stage;
}

// total[r][i] = row r of the simdgroup's weight rows . x row i, in every lane (after simd_sum); zero for
// rows that do not exist. Every thread of the threadgroup calls it (barriers inside).
template <typename D, typename T, int XRows>
void decode_product(thread const DecodeOperands<XRows>& in, threadgroup uchar* stage, uint lane, uint simdgroup,
                    thread float (&total)[DecodeShape<D>::rows][XRows]) {
  constexpr uint kRows = DecodeShape<D>::rows, kSpan = DecodeShape<D>::span;
  constexpr uint kRowStage = DecodeShape<D>::row_stage;
  constexpr uint kXBytes = kStep * sizeof(T);  // staged bytes per x row and step
  threadgroup uchar* x_stage = stage;                                                      // [XRows][kXBytes]
  threadgroup uchar* w_stage = stage + XRows * kXBytes + simdgroup * kRows * kRowStage;  // [kRows][kRowStage]
  const uint x_align = in.x_align | kXBytes;  // every full step's words
  uint row_line[kRows];
  for (uint r = 0; r < kRows; ++r) row_line[r] = (in.w_line + r * in.row_bytes) % 128u;

  float acc[kRows][XRows];
  for (uint r = 0; r < kRows; ++r)
    for (int i = 0; i < XRows; ++i) acc[r][i] = 0.0f;

  const uint full_steps = in.K / kStep, tail = in.K % kStep;
  const uint steps = full_steps + (tail != 0);
  for (uint step = 0; step < steps; ++step) {
    const bool last = step == full_steps;  // the partial step, handled once
    const uint x_bytes = last ? tail * sizeof(T) : kXBytes;
    const uint x_fill = last ? (tail + 15) / 16 * 16 * sizeof(T) : kXBytes;  // zeros to whole runs
    if (simdgroup == 0) {  // x: one simdgroup stages it for the threadgroup
      for (int i = 0; i < XRows; ++i) {
        threadgroup uchar* dst = x_stage + i * kXBytes;
        if (uint(i) < in.x_live) {
          stage_bytes(dst, in.x_row[i] + size_t(step) * kXBytes, x_bytes, x_align | x_bytes, lane);
          if (last) zero_bytes(dst, x_bytes, x_fill, lane);
        } else {
          zero_bytes(dst, 0, x_fill, lane);
        }
      }
    }
    // Weights: row bytes [step * kSpan, + kSpan) are needed. The step stages from where the previous one
    // stopped to the first line start past them, so every load but a row's first and last covers whole
    // lines; the bytes past this step's share (under 128) are kept for the next step. In threadgroup
    // memory a row byte sits at the same address modulo 16 as in device memory: the words line up.
    for (uint r = 0; r < in.w_live; ++r) {
      threadgroup uchar* row = w_stage + r * kRowStage;
      const uint first = step * kSpan;
      const uint begin = step == 0 ? 0u : next_line(first, row_line[r], in.row_bytes);
      const uint end = next_line(first + kSpan, row_line[r], in.row_bytes);
      const uint pad = (row_line[r] + first) % 16u;  // where byte `first` sits in `row`
      if (step > 0) {  // the previous step's extra bytes to the front
        const uint previous_pad = (row_line[r] + first - kSpan) % 16u;
        for (uint i = lane; i < begin - first; i += 32) row[pad + i] = row[previous_pad + kSpan + i];
        simdgroup_barrier(mem_flags::mem_threadgroup);
      }
      stage_bytes(row + pad + (begin - first), in.w_row + size_t(r) * in.row_bytes + begin, end - begin,
                  (row_line[r] + begin) | (end - begin), lane);
      if (last && D::is_float) {  // float rows: zeros to whole runs (quantized rows are whole blocks)
        zero_bytes(row, pad + in.row_bytes - first, pad + ((tail + 15) / 16 * 16) * D::block_bytes, lane);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const uint runs = last ? (tail + 15) / 16 : kStep / 16;
    if (lane < runs) {
      float ws[kRows][16];
      for (uint r = 0; r < in.w_live; ++r) {
        D::staged16(w_stage + r * kRowStage + (row_line[r] + step * kSpan) % 16u, lane, ws[r]);
      }
      for (int i = 0; i < XRows; ++i) {
        threadgroup const T* xr = (threadgroup const T*)(x_stage + i * kXBytes) + 16 * lane;
        float xs[16];
        for (int j = 0; j < 16; ++j) xs[j] = FloatIO<T>::load(xr[j]);
        for (uint r = 0; r < in.w_live; ++r) {
          float dot = 0.0f;
          for (int j = 0; j < 16; ++j) dot += ws[r][j] * xs[j];
          acc[r][i] += dot;
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step (or product) restages
  }

  for (uint r = 0; r < kRows; ++r)
    for (int i = 0; i < XRows; ++i) total[r][i] = simd_sum(acc[r][i]);  // every lane takes part
}
