// Flash attention on the CPU: each work item takes the queries of one block of positions for every query head
// that shares one kv head (so K and V are read once for all of them), and walks its keys in blocks with the
// online softmax (running max m, sum l, unnormalized output O per row): no Tq x Tk matrix exists. Scores come
// from an outer-product form (the key block transposed once into a D x keys scratch, then broadcast query
// elements times key vectors: no horizontal sums), the output from probabilities times value rows. When
// there are fewer items than threads (decode: one query per head), the keys are also split between items
// and the partial (m, l, O) combined at the end.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vec_math.h"

namespace ggml_ext::cpu::GGML_EXT_ISA {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxRows = 64;         // query rows (all heads of a group together) per item
constexpr int64_t kMinKeysPerSplit = 256;
// From this many rows per item the keys are transposed once per block for outer-product scores; below it
// (decode's one query per head), each score is a dot product.
constexpr int64_t kMinRowsForTranspose = 8;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
// Key columns are processed in pairs of vectors (eight accumulators in flight hide the FMA latency).
constexpr int64_t kColumnStep = 2 * kLanes;
int64_t padded(int64_t n) { return round_up(n, kColumnStep); }

// How the work is cut: items = batch x kv heads x query blocks x key splits.
struct Plan {
  int64_t n_rep;          // query heads per kv head
  int64_t q_block;        // query positions per item
  int64_t q_blocks;
  int64_t key_block;      // keys per inner step (a multiple of kLanes)
  int64_t splits;         // key ranges per (batch, kv head, query block)
  int64_t keys_per_split;
  int64_t rows() const { return n_rep * q_block; }
  int64_t units(const AttentionArgs& a) const { return a.batch * a.kv_heads * q_blocks; }
};

Plan make_plan(const AttentionArgs& a) {
  Plan p{};
  p.n_rep = a.q_heads / a.kv_heads;
  const int64_t threads = num_threads();
  p.q_block = std::max<int64_t>(1, std::min<int64_t>(a.q_len, kMaxRows / p.n_rep));
  // Smaller query blocks until every thread has a few items (rows are cheap to split, keys need a combine).
  auto units = [&](int64_t qb) { return a.batch * a.kv_heads * ((a.q_len + qb - 1) / qb); };
  while (p.q_block > 4 && units(p.q_block) < 4 * threads) p.q_block /= 2;
  p.q_blocks = (a.q_len + p.q_block - 1) / p.q_block;
  // A key block's transposed keys (head_dim x key_block floats) stay within about 32 KB (L1).
  p.key_block = std::clamp<int64_t>(8192 / std::max<int64_t>(1, a.head_dim) / kColumnStep * kColumnStep, kColumnStep,
                                    std::max<int64_t>(128, kColumnStep));
  p.splits = 1;
  const int64_t u = units(p.q_block);
  if (u < 2 * threads && a.kv_len >= 2 * kMinKeysPerSplit) {
    p.splits = std::min((2 * threads + u - 1) / u, a.kv_len / kMinKeysPerSplit);
  }
  p.keys_per_split = std::max(p.key_block, round_up((a.kv_len + p.splits - 1) / p.splits, p.key_block));
  p.splits = std::max<int64_t>(1, (a.kv_len + p.keys_per_split - 1) / p.keys_per_split);
  return p;
}

// A work item's scratch, one per thread (reused across items).
struct Scratch {
  std::vector<float> q, o, s, kt, m, l;
  void size_for(const AttentionArgs& a, const Plan& p) {
    const int64_t rows = p.rows(), kb = p.key_block;
    q.resize(rows * a.head_dim);
    o.resize(rows * round_up(a.v_dim, kLanes));
    s.resize(rows * kb);
    kt.resize(a.head_dim * kb);
    m.resize(rows);
    l.resize(rows);
  }
};

template <class Fmt>
class Item {
  using T = typename Fmt::T;

 public:
  Item(const AttentionArgs& a, const Plan& p, Scratch& w, int64_t unit)
      : a_(a), p_(p), w_(w), vd_pad_(round_up(a.v_dim, kLanes)) {
    i0_ = (unit % p.q_blocks) * p.q_block;
    const int64_t bh = unit / p.q_blocks;  // b * kv_heads + kv head
    b_ = bh / a.kv_heads;
    kvh_ = bh % a.kv_heads;
    nq_ = std::min(p.q_block, a.q_len - i0_);
    rows_ = p.n_rep * nq_;
    k_ = static_cast<const T*>(a.k) + b_ * a.k_strides[0] + kvh_ * a.k_strides[1];
    v_ = static_cast<const T*>(a.v) + b_ * a.v_strides[0] + kvh_ * a.v_strides[1];
  }

  int64_t rows() const { return rows_; }
  int64_t batch() const { return b_; }
  // Row r is query position i0 + r % nq of query head kvh * n_rep + r / nq.
  int64_t head(int64_t r) const { return kvh_ * p_.n_rep + r / nq_; }
  int64_t position(int64_t r) const { return i0_ + r % nq_; }
  int64_t out_row(int64_t r) const { return (b_ * a_.q_heads + head(r)) * a_.q_len + position(r); }

  // Runs the online softmax over keys [j0, j1); leaves m, l and O (unnormalized) in the scratch.
  void run(int64_t j0, int64_t j1) {
    load_queries();
    std::fill(w_.m.begin(), w_.m.begin() + rows_, kNegInf);
    std::fill(w_.l.begin(), w_.l.begin() + rows_, 0.0f);
    std::fill(w_.o.begin(), w_.o.begin() + rows_ * vd_pad_, 0.0f);
    if (a_.causal) j1 = std::min(j1, i0_ + nq_ + (a_.kv_len - a_.q_len));  // the last row's last key + 1
    for (int64_t jb = j0; jb < j1; jb += p_.key_block) {
      const int64_t n = std::min(p_.key_block, j1 - jb);
      if (rows_ >= kMinRowsForTranspose) {
        transpose_keys(jb, n);
        scores(n);
      } else {
        scores_by_dots(jb, n);
      }
      add_softcap_mask_and_causal(jb, n);
      softmax_and_values(jb, n);
    }
  }

 private:
  // Queries in float32, times the scale (over the softcap, which then takes tanh of the product directly).
  void load_queries() {
    const float factor = a_.softcap > 0.0f ? a_.scale / a_.softcap : a_.scale;
    const T* q = static_cast<const T*>(a_.q);
    for (int64_t r = 0; r < rows_; ++r) {
      const T* src = q + b_ * a_.q_strides[0] + head(r) * a_.q_strides[1] + position(r) * a_.q_strides[2];
      float* dst = w_.q.data() + r * a_.head_dim;
      for (int64_t d = 0; d < a_.head_dim; ++d) dst[d] = Fmt::to_f32(src[d]) * factor;
    }
  }

  // kt[d][j] = k[jb + j][d] for j < n, zeros up to the next whole vector.
  void transpose_keys(int64_t jb, int64_t n) {
    const int64_t kb = p_.key_block, n_pad = padded(n);
    float* kt = w_.kt.data();
    for (int64_t j = 0; j < n; ++j) {
      const T* row = k_ + (jb + j) * a_.k_strides[2];
      for (int64_t d = 0; d < a_.head_dim; ++d) kt[d * kb + j] = Fmt::to_f32(row[d]);
    }
    for (int64_t d = 0; d < a_.head_dim; ++d) std::fill(kt + d * kb + n, kt + d * kb + n_pad, 0.0f);
  }

  // s[r][j] = q_r . k_j: four rows by two key vectors per pass over the head dim (eight independent sums).
  void scores(int64_t n) {
    const int64_t kb = p_.key_block, n_pad = padded(n), dim = a_.head_dim;
    const float* kt = w_.kt.data();
    for (int64_t r0 = 0; r0 < rows_; r0 += 4) {
      const int64_t nr = std::min<int64_t>(4, rows_ - r0);
      const float* q0 = w_.q.data() + r0 * dim;
      for (int64_t c = 0; c < n_pad; c += kColumnStep) {
        vf32 acc[4][2] = {};
        if (nr == 4) {
          for (int64_t d = 0; d < dim; ++d) {
            const vf32 k0 = F32::load(kt + d * kb + c), k1 = F32::load(kt + d * kb + c + kLanes);
            for (int i = 0; i < 4; ++i) {
              acc[i][0] += q0[i * dim + d] * k0;
              acc[i][1] += q0[i * dim + d] * k1;
            }
          }
        } else {
          for (int64_t d = 0; d < dim; ++d) {
            const vf32 k0 = F32::load(kt + d * kb + c), k1 = F32::load(kt + d * kb + c + kLanes);
            for (int64_t i = 0; i < nr; ++i) {
              acc[i][0] += q0[i * dim + d] * k0;
              acc[i][1] += q0[i * dim + d] * k1;
            }
          }
        }
        for (int64_t i = 0; i < nr; ++i) {
          F32::store(w_.s.data() + (r0 + i) * kb + c, acc[i][0]);
          F32::store(w_.s.data() + (r0 + i) * kb + c + kLanes, acc[i][1]);
        }
      }
    }
  }

  // s[r][j] = q_r . k_j as dot products along the head dim, each key row read once for every row (up to four):
  // for a few rows (decode) transposing the keys would cost more than the products.
  void scores_by_dots(int64_t jb, int64_t n) {
    const int64_t kb = p_.key_block, dim = a_.head_dim, dim_vec = dim / kLanes * kLanes;
    for (int64_t j = 0; j < n; ++j) {
      const T* krow = k_ + (jb + j) * a_.k_strides[2];
      for (int64_t r0 = 0; r0 < rows_; r0 += 4) {
        const int64_t nr = std::min<int64_t>(4, rows_ - r0);
        const float* q0 = w_.q.data() + r0 * dim;
        vf32 acc[4] = {};
        for (int64_t d = 0; d < dim_vec; d += kLanes) {
          const vf32 kv = Fmt::load(krow + d);
          for (int64_t i = 0; i < nr; ++i) acc[i] += F32::load(q0 + i * dim + d) * kv;
        }
        for (int64_t i = 0; i < nr; ++i) {
          float sum = hsum(acc[i]);
          for (int64_t d = dim_vec; d < dim; ++d) sum += q0[i * dim + d] * Fmt::to_f32(krow[d]);
          w_.s[(r0 + i) * kb + j] = sum;
        }
      }
    }
  }

  void add_softcap_mask_and_causal(int64_t jb, int64_t n) {
    const int64_t kb = p_.key_block, n_pad = padded(n);
    const int64_t offset = a_.kv_len - a_.q_len;
    for (int64_t r = 0; r < rows_; ++r) {
      float* s = w_.s.data() + r * kb;
      if (a_.softcap > 0.0f) {
        for (int64_t c = 0; c < n_pad; c += kLanes) F32::store(s + c, a_.softcap * tanh_v(F32::load(s + c)));
      }
      if (a_.mask) {
        const float* mrow = a_.mask + b_ * a_.mask_strides[0] + head(r) * a_.mask_strides[1] +
                            position(r) * a_.mask_strides[2];
        for (int64_t j = 0; j < n; ++j) s[j] += mrow[(jb + j) * a_.mask_strides[3]];
      }
      // Keys this row may not see (causal), and the padding past n, score -inf.
      int64_t visible = n;
      if (a_.causal) visible = std::clamp<int64_t>(position(r) + offset + 1 - jb, 0, n);
      std::fill(s + visible, s + n_pad, kNegInf);
    }
  }

  void softmax_and_values(int64_t jb, int64_t n) {
    const int64_t kb = p_.key_block, n_pad = padded(n);
    for (int64_t r = 0; r < rows_; ++r) {
      float* s = w_.s.data() + r * kb;
      vf32 mv = splat(kNegInf);
      for (int64_t c = 0; c < n_pad; c += kLanes) {
        const vf32 x = F32::load(s + c);
        mv = x > mv ? x : mv;
      }
      float block_max = kNegInf;
      for (int l = 0; l < kLanes; ++l) block_max = std::max(block_max, mv[l]);
      if (block_max == kNegInf) {  // nothing visible in this block (or NaN-free -inf scores only)
        std::fill(s, s + n_pad, 0.0f);
        continue;
      }
      const float m_new = std::max(w_.m[r], block_max);
      const float correction = std::exp(w_.m[r] - m_new);  // 0 for the first visible block
      vf32 sum = {};
      const vf32 shift = splat(m_new);
      for (int64_t c = 0; c < n_pad; c += kLanes) {
        const vf32 e = exp_v(F32::load(s + c) - shift);
        sum += e;
        F32::store(s + c, e);
      }
      w_.l[r] = w_.l[r] * correction + hsum(sum);
      w_.m[r] = m_new;
      if (correction != 1.0f) {
        float* o = w_.o.data() + r * vd_pad_;
        for (int64_t c = 0; c < vd_pad_; c += kLanes) F32::store(o + c, F32::load(o + c) * correction);
      }
    }
    accumulate_values(jb, n);
  }

  // O[r] += sum_j p[r][j] v_j: four rows by two vectors of O in registers per pass over the keys.
  void accumulate_values(int64_t jb, int64_t n) {
    const int64_t kb = p_.key_block, vd = a_.v_dim, vd_vec = vd / kLanes * kLanes;
    const float* p = w_.s.data();
    float* o = w_.o.data();
    for (int64_t r0 = 0; r0 < rows_; r0 += 4) {
      const int64_t nr = std::min<int64_t>(4, rows_ - r0);
      for (int64_t c = 0; c < vd_vec; c += 2 * kLanes) {
        const bool two = c + kLanes < vd_vec;
        vf32 acc[4][2] = {};
        for (int64_t j = 0; j < n; ++j) {
          const T* vrow = v_ + (jb + j) * a_.v_strides[2] + c;
          const vf32 v0 = Fmt::load(vrow), v1 = two ? Fmt::load(vrow + kLanes) : vf32{};
          for (int64_t i = 0; i < nr; ++i) {
            const float pj = p[(r0 + i) * kb + j];
            acc[i][0] += pj * v0;
            acc[i][1] += pj * v1;
          }
        }
        for (int64_t i = 0; i < nr; ++i) {
          float* orow = o + (r0 + i) * vd_pad_ + c;
          F32::store(orow, F32::load(orow) + acc[i][0]);
          if (two) F32::store(orow + kLanes, F32::load(orow + kLanes) + acc[i][1]);
        }
      }
      for (int64_t d = vd_vec; d < vd; ++d) {  // a head dim that is not a whole number of vectors
        for (int64_t i = 0; i < nr; ++i) {
          float acc = 0.0f;
          for (int64_t j = 0; j < n; ++j) acc += p[(r0 + i) * kb + j] * Fmt::to_f32(v_[(jb + j) * a_.v_strides[2] + d]);
          o[(r0 + i) * vd_pad_ + d] += acc;
        }
      }
    }
  }

  const AttentionArgs& a_;
  const Plan& p_;
  Scratch& w_;
  int64_t vd_pad_, i0_ = 0, b_ = 0, kvh_ = 0, nq_ = 0, rows_ = 0;
  const T* k_ = nullptr;
  const T* v_ = nullptr;
};

// y = O / l, zeros for a row that saw no key; a sink's exp(sink - m) joins l (the max m taken over it too:
// when the sink exceeds m, O and l are rescaled by exp(m - sink), which is 0 for a row that saw no key).
template <class Fmt>
void store_row(const float* o, float m, float l, float sink, int64_t dim, typename Fmt::T* y) {
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (sink != kNegInf) {
    if (sink > m) {
      const float shrink = std::exp(m - sink);
      inv = shrink / (l * shrink + 1.0f);
    } else {
      inv = 1.0f / (l + std::exp(sink - m));
    }
  }
  for (int64_t d = 0; d < dim; ++d) y[d] = Fmt::from_f32(o[d] * inv);
}

float sink_of(const AttentionArgs& a, int64_t b, int64_t h) {
  return a.sinks ? a.sinks[b * a.sinks_batch_stride + h] : kNegInf;
}

template <class Fmt>
void attention_typed(const AttentionArgs& a) {
  using T = typename Fmt::T;
  const Plan p = make_plan(a);
  const int64_t units = p.units(a), rows = p.rows(), vd_pad = round_up(a.v_dim, kLanes);
  T* y = static_cast<T*>(a.y);
  // Partial results of split keys: per (unit, split), rows x (m, l, O).
  const int64_t partial_size = rows * (2 + vd_pad);
  std::vector<float> partials(p.splits > 1 ? units * p.splits * partial_size : 0);
  parallel_for(units * p.splits, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    scratch.size_for(a, p);
    for (int64_t it = begin; it < end; ++it) {
      const int64_t unit = it / p.splits, split = it % p.splits;
      Item<Fmt> item(a, p, scratch, unit);
      const int64_t j0 = split * p.keys_per_split;
      item.run(j0, std::min(a.kv_len, j0 + p.keys_per_split));
      for (int64_t r = 0; r < item.rows(); ++r) {
        const float* o = scratch.o.data() + r * vd_pad;
        if (p.splits == 1) {
          store_row<Fmt>(o, scratch.m[r], scratch.l[r], sink_of(a, item.batch(), item.head(r)), a.v_dim,
                         y + item.out_row(r) * a.v_dim);
        } else {
          float* dst = partials.data() + it * partial_size + r * (2 + vd_pad);
          dst[0] = scratch.m[r];
          dst[1] = scratch.l[r];
          std::copy(o, o + a.v_dim, dst + 2);
        }
      }
    }
  });
  if (p.splits == 1) return;
  parallel_for(units, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    scratch.size_for(a, p);
    std::vector<float> o(a.v_dim);
    for (int64_t unit = begin; unit < end; ++unit) {
      Item<Fmt> item(a, p, scratch, unit);  // for the rows' output positions
      for (int64_t r = 0; r < item.rows(); ++r) {
        auto part = [&](int64_t split) { return partials.data() + (unit * p.splits + split) * partial_size + r * (2 + vd_pad); };
        float m = kNegInf;
        for (int64_t sp = 0; sp < p.splits; ++sp) m = std::max(m, part(sp)[0]);
        float l = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        if (m != kNegInf) {
          for (int64_t sp = 0; sp < p.splits; ++sp) {
            const float* src = part(sp);
            if (src[1] == 0.0f) continue;
            const float f = std::exp(src[0] - m);
            l += src[1] * f;
            for (int64_t d = 0; d < a.v_dim; ++d) o[d] += src[2 + d] * f;
          }
        }
        store_row<Fmt>(o.data(), m, l, sink_of(a, item.batch(), item.head(r)), a.v_dim,
                       y + item.out_row(r) * a.v_dim);
      }
    }
  });
}

}  // namespace

void attention(const AttentionArgs& a) {
  if (a.batch * a.q_heads * a.q_len * a.v_dim == 0) return;
  GGML_EXT_FLOAT_SWITCH(a.type, Fmt, attention_typed<Fmt>(a));
}

}  // namespace ggml_ext::cpu::GGML_EXT_ISA

namespace ggml_ext::cpu {
GGML_EXT_DISPATCH(attention, AttentionArgs)
}
