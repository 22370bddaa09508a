// The emulator's memory-traffic model and byte-exact bounds checks (see traffic.h). Compiled without
// instrumentation: it defines the hooks that the instrumented kernel code calls.
#include "traffic.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

namespace metal_emu {
namespace {

constexpr uint64_t kLine = 128;

struct Access {
  uint32_t epoch, seq, size;
  int buffer;  // index into g_buffers
  uint64_t offset;
};

struct LaneLog {
  uint32_t epoch = 0, seq = 0;
  std::vector<Access> loads;
};

struct Totals {
  uint64_t lane_bytes = 0, unique_bytes = 0, instructions = 0, coalesced = 0, narrow = 0, misaligned = 0;
  uint64_t lines = 0, min_lines = 0;
};

std::vector<TrafficBuffer> g_buffers;
bool g_counting = false;
std::vector<LaneLog> g_lanes;
std::map<int, Totals> g_totals;  // by buffer index

[[noreturn]] void out_of_bounds(const TrafficBuffer& b, const unsigned char* p, size_t n, bool is_write) {
  char msg[320];
  std::snprintf(msg, sizeof msg,
                "metal_emu: out-of-bounds access to %s (size %zu) at byte offset %ld (a %zu-byte %s)\n",
                b.name.c_str(), b.size, static_cast<long>(p - b.data), n, is_write ? "write" : "read");
  (void)!write(2, msg, std::strlen(msg));
  _exit(4);
}

// Every instrumented access: a bounds check against the buffer whose mapping holds it; device loads of a
// lane are logged when counting.
inline void on_access(const void* address, size_t n, bool write) {
  const auto* p = static_cast<const unsigned char*>(address);
  for (size_t i = 0; i < g_buffers.size(); ++i) {
    const TrafficBuffer& b = g_buffers[i];
    if (p < b.region || p >= b.region + b.region_size) continue;
    if (p < b.data || p + n > b.data + b.size) out_of_bounds(b, p, n, write);
    if (write || !g_counting || b.index < 0) return;
    const int lane = current_lane_index();
    if (lane < 0) return;
    LaneLog& log = g_lanes[lane];
    log.loads.push_back({log.epoch, log.seq++, static_cast<uint32_t>(n), static_cast<int>(i),
                         static_cast<uint64_t>(p - b.data)});
    return;
  }
}

// One simdgroup load instruction: the lanes' accesses with the same (epoch, seq) to one buffer.
void account(const std::vector<const Access*>& lanes) {
  Totals& t = g_totals[g_buffers[lanes[0]->buffer].index];
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::set<uint64_t> lines;
  bool words = true, aligned = true;
  for (const Access* a : lanes) {
    t.lane_bytes += a->size;
    ranges.push_back({a->offset, a->offset + a->size});
    for (uint64_t l = a->offset / kLine; l <= (a->offset + a->size - 1) / kLine; ++l) lines.insert(l);
    words &= (a->size == 4 || a->size == 8 || a->size == 16) && a->size == lanes[0]->size;
    aligned &= a->size > 16 || a->offset % a->size == 0;
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t unique = 0, end = 0;
  for (const auto& [lo, hi] : ranges) {
    const uint64_t from = std::max(lo, end);
    if (hi > from) unique += hi - from;
    end = std::max(end, hi);
  }
  const uint64_t min_lines = (unique + kLine - 1) / kLine;
  t.unique_bytes += unique;
  t.instructions += 1;
  t.lines += lines.size();
  t.min_lines += min_lines;
  t.narrow += lanes[0]->size < 4;
  t.misaligned += !aligned;
  t.coalesced += words && aligned && lines.size() == min_lines;
}

}  // namespace

void traffic_set_buffers(std::vector<TrafficBuffer> buffers, bool counting) {
  g_buffers = std::move(buffers);
  g_counting = counting;
}

void traffic_begin_threadgroup(int lanes) {
  g_lanes.assign(g_counting ? lanes : 0, LaneLog{});
}

void traffic_lane_sync(int lane) {
  if (!g_counting) return;
  g_lanes[lane].epoch += 1;
  g_lanes[lane].seq = 0;
}

void traffic_end_threadgroup(int simd_width) {
  if (!g_counting) return;
  const int n = static_cast<int>(g_lanes.size());
  for (int first = 0; first < n; first += simd_width) {
    std::map<std::tuple<uint32_t, uint32_t, int>, std::vector<const Access*>> instructions;
    for (int l = first; l < std::min(n, first + simd_width); ++l)
      for (const Access& a : g_lanes[l].loads) instructions[{a.epoch, a.seq, a.buffer}].push_back(&a);
    for (const auto& [key, lanes] : instructions) account(lanes);
  }
}

void traffic_write_report(const std::string& path) {
  std::ofstream out(path);
  out << "{";
  const char* sep = "";
  for (const auto& [index, t] : g_totals) {
    out << sep << "\"" << index << "\": {\"lane_bytes\": " << t.lane_bytes << ", \"unique_bytes\": "
        << t.unique_bytes << ", \"instructions\": " << t.instructions << ", \"coalesced\": " << t.coalesced
        << ", \"narrow\": " << t.narrow << ", \"misaligned\": " << t.misaligned << ", \"lines\": " << t.lines
        << ", \"min_lines\": " << t.min_lines << "}";
    sep = ", ";
  }
  out << "}\n";
}

}  // namespace metal_emu

// ThreadSanitizer's instrumentation entry points, called by the kernel translation units (traffic.h).
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
#define METAL_EMU_TSAN_SIZE(n)                                                                  \
  void __tsan_read##n(void* p) { metal_emu::on_access(p, n, false); }                          \
  void __tsan_write##n(void* p) { metal_emu::on_access(p, n, true); }                          \
  void __tsan_unaligned_read##n(void* p) { metal_emu::on_access(p, n, false); }                \
  void __tsan_unaligned_write##n(void* p) { metal_emu::on_access(p, n, true); }                \
  void __tsan_volatile_read##n(void* p) { metal_emu::on_access(p, n, false); }                 \
  void __tsan_volatile_write##n(void* p) { metal_emu::on_access(p, n, true); }
METAL_EMU_TSAN_SIZE(1)
METAL_EMU_TSAN_SIZE(2)
METAL_EMU_TSAN_SIZE(4)
METAL_EMU_TSAN_SIZE(8)
METAL_EMU_TSAN_SIZE(16)
#undef METAL_EMU_TSAN_SIZE
void __tsan_read_range(void* p, unsigned long n) { metal_emu::on_access(p, n, false); }
void __tsan_write_range(void* p, unsigned long n) { metal_emu::on_access(p, n, true); }
void __tsan_vptr_read(void**) {}
void __tsan_vptr_update(void**, void*) {}
}
