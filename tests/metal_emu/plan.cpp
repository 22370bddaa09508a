// Prints the launch plan csrc/backend/metal would encode (csrc/backend/metal/launch_plans.h) for an op and
// its shapes, as JSON: kernel, grid, threadgroup memory and the argument block's bytes (hex). The emulator
// tests dispatch exactly that. Usage: metal_plan op=rope dtype=f32 tokens=3 ... (key=value, see below).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "csrc/backend/metal/launch_plans.h"

namespace {

using namespace ggml_ext_metal;
using Fields = std::map<std::string, std::string>;

const std::string& field(const Fields& f, const char* key) {
  auto it = f.find(key);
  if (it == f.end()) throw std::invalid_argument(std::string("missing ") + key);
  return it->second;
}
uint32_t u32(const Fields& f, const char* key) { return static_cast<uint32_t>(std::stoul(field(f, key))); }
uint32_t u32_or(const Fields& f, const char* key, uint32_t otherwise) {
  return f.count(key) ? u32(f, key) : otherwise;
}
float f32(const Fields& f, const char* key) { return std::strtof(field(f, key).c_str(), nullptr); }

template <typename Args>
std::string json(const Plan<Args>& p) {
  char head[256];
  std::snprintf(head, sizeof head,
                "{\"kernel\": \"%s\", \"groups\": [%u, %u, %u], \"threads\": %u, \"threadgroup_bytes\": %u, ",
                p.kernel.c_str(), p.grid.groups[0], p.grid.groups[1], p.grid.groups[2], p.grid.threads,
                p.grid.threadgroup_bytes);
  std::string out = std::string(head) + "\"args\": \"";
  unsigned char bytes[sizeof(Args)];
  std::memcpy(bytes, &p.args, sizeof bytes);
  for (unsigned char b : bytes) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", b);
    out += hex;
  }
  return out + "\"}";
}

template <typename Args>
void print(const Plan<Args>& p) {
  std::printf("%s\n", json(p).c_str());
}

// A plan of two dispatches: the first's JSON with the other one under `key` (null when there is none, kernel "")
// and the size of the buffer between them under `bytes_key`.
template <typename Args>
void print_pair(const Plan<Args>& first, const char* key, const Plan<Args>& other, const char* bytes_key,
                uint64_t bytes) {
  std::string head = json(first);
  head.pop_back();
  std::printf("%s, \"%s\": %s, \"%s\": %llu}\n", head.c_str(), key,
              other.kernel.empty() ? "null" : json(other).c_str(), bytes_key, static_cast<unsigned long long>(bytes));
}

// mul_mat_id: the product's plan, with the grouping dispatch ("group") and the scratch size.
void print(const MulMatIdPlan& p) { print_pair(p.product, "group", p.group, "scratch_bytes", p.scratch_bytes); }

// attention: the main dispatch's plan with the combine ("combine", null with one split) and the partials' size.
void print(const AttentionPlan& p) { print_pair(p.main, "combine", p.combine, "partials_bytes", p.partials_bytes); }

// Four comma-separated integers (element strides).
template <typename I>
void ints4(const Fields& f, const char* key, I (&out)[4]) {
  std::string s = field(f, key);
  for (int i = 0; i < 4; ++i) {
    const size_t comma = s.find(',');
    out[i] = static_cast<I>(std::stoll(s.substr(0, comma)));
    s = comma == std::string::npos ? "" : s.substr(comma + 1);
  }
}

AttentionArgs attention_args(const Fields& f) {
  AttentionArgs a{};
  a.batch = u32(f, "batch");
  a.q_heads = u32(f, "q_heads");
  a.kv_heads = u32(f, "kv_heads");
  a.q_len = u32(f, "q_len");
  a.kv_len = u32(f, "kv_len");
  a.head_dim = u32(f, "head_dim");
  a.v_dim = u32(f, "v_dim");
  ints4(f, "q_strides", a.q_strides);
  ints4(f, "k_strides", a.k_strides);
  ints4(f, "v_strides", a.v_strides);
  a.has_mask = u32(f, "has_mask");
  if (a.has_mask) ints4(f, "mask_strides", a.mask_strides);
  a.has_sinks = u32(f, "has_sinks");
  a.sinks_batch_stride = u32_or(f, "sinks_batch_stride", 0);
  a.scale = f32(f, "scale");
  a.softcap = f32(f, "softcap");
  a.causal = u32(f, "causal");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Fields f;
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (!eq) return 2;
    f[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = eq + 1;
  }
  const std::string& op = field(f, "op");
  if (op == "rms_norm") {
    print(plan_rms_norm(field(f, "dtype"), u32(f, "rows"),
                        RmsNormArgs{u32(f, "dim"), u32(f, "rows_per_weight"), u32(f, "weighted"), f32(f, "eps"),
                                    // the emulator's buffers start 128-byte aligned
                                    u32_or(f, "vec4", u32(f, "dim") % 4 == 0), u32_or(f, "residual", 0)}));
  } else if (op == "rope") {
    print(plan_rope(field(f, "dtype"), u32(f, "batches"),
                    RopeArgs{u32(f, "tokens"), u32(f, "heads"), u32(f, "dim"), u32(f, "n_dims"),
                             u32(f, "batches_per_positions_row"), u32(f, "batches_per_factors_row"), u32(f, "neox"),
                             u32(f, "has_factors"), u32(f, "has_ramp"), f32(f, "theta_scale"), f32(f, "freq_scale"),
                             f32(f, "mscale"), f32(f, "sin_sign"),
                             // the emulator's buffers start 128-byte aligned
                             u32_or(f, "vec4", rope_vec4_shape(u32(f, "dim"), u32(f, "n_dims"), u32(f, "neox") != 0) &&
                                                   !u32_or(f, "has_norm", 0)),
                             u32_or(f, "copied_heads", 0), u32_or(f, "has_norm", 0), u32_or(f, "q_heads", 0),
                             f.count("norm_eps") ? f32(f, "norm_eps") : 0.0f}));
  } else if (op == "glu") {
    print(plan_glu(field(f, "kind"), field(f, "dtype"),
                   GluArgs{u32(f, "rows"), u32(f, "cols"), u32(f, "in_stride"), u32(f, "up_offset"), f32(f, "alpha"),
                           f32(f, "limit")}));
  } else if (op == "dequantize") {
    print(plan_dequantize(field(f, "type"), u32(f, "block_size"), field(f, "dtype"),
                          std::stoull(field(f, "n_blocks"))));
  } else if (op == "matmul") {
    print(plan_matmul(field(f, "type"), field(f, "x_dtype"), u32(f, "transposed") != 0, u32(f, "batches"),
                      MatmulArgs{u32(f, "M"), u32(f, "N"), u32(f, "K"), u32(f, "row_bytes"), u32(f, "B2"),
                                 u32(f, "A2"), u32(f, "r2"), u32(f, "r3"), u32(f, "out_type"),
                                 // the emulator's buffers start 128-byte aligned
                                 u32_or(f, "w_line", 0), u32_or(f, "x_line", 0)}));
  } else if (op == "mul_mat_id") {
    print(plan_mul_mat_id(field(f, "type"), field(f, "dtype"), u32(f, "transposed") != 0,
                          MulMatIdArgs{u32(f, "tokens"), u32(f, "n_used"), u32(f, "x_slots"), u32(f, "experts"),
                                       u32(f, "N"), u32(f, "K"), u32(f, "row_bytes"),
                                       // the emulator's buffers start 128-byte aligned
                                       u32_or(f, "w_line", 0), u32_or(f, "x_line", 0)}));
  } else if (op == "rows_copy") {
    RowsCopyArgs a{u32(f, "batch"), u32(f, "heads"), u32(f, "rows"), u32(f, "dim"), {}, u32(f, "dst_rows"),
                   u32(f, "row0")};
    ints4(f, "strides", a.strides);
    print(plan_rows_copy(u32(f, "element_bytes"), a));
  } else if (op == "attention") {
    // the emulator's buffers start 128-byte aligned
    print(plan_attention(field(f, "dtype"), attention_args(f), u32_or(f, "k_line", 0), u32_or(f, "v_line", 0)));
  } else {
    return 2;
  }
  return 0;
}
