// The emulator's memory-traffic model: every load and store of an emulated kernel reaches it, and it
// (1) checks each access against the buffer it falls in, byte-exact (a read 1 byte past a buffer's end is
// reported, not just one that reaches the guard page), and (2) when counting is on, records the device
// loads per lane and, per threadgroup, turns them into simdgroup load instructions.
//
// How accesses reach it: the kernel translation units are compiled with g++'s -fsanitize=thread, whose
// instrumentation calls __tsan_readN/__tsan_writeN(address) before every memory access; traffic.cpp
// defines those functions (libtsan is not linked: nothing of ThreadSanitizer runs). -fno-tree-sra keeps
// an aggregate load (a uint4 or float4 read through a device pointer) one access of its full size.
//
// The simdgroup model: lanes of a simdgroup run in lockstep on the GPU, so the i-th device load a lane
// issues after its e-th synchronization point (barrier or simd collective) is taken to be the same
// instruction as the i-th load of every other lane of its simdgroup in that interval. Per instruction:
//   unique bytes: the union of the bytes its lanes read (a broadcast read counts once);
//   lines: the 128-byte lines it touches, against the fewest that could hold the union; the bytes it
//          requests from device memory are taken as lines x 128 (no cache is modelled: a line read again
//          by a later instruction is requested again);
//   coalesced: every lane reads an aligned 4-, 8- or 16-byte word, all the same size, and the lines
//              touched are the fewest possible (adjacent words, or the same word).
// These are proxies of what an Apple GPU's memory system would see, not timings.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace metal_emu {

struct TrafficBuffer {
  std::string name;                 // "buffer(1)", "threadgroup(0)"
  int index;                        // buffer index; -1 for threadgroup memory (checked, never counted)
  const unsigned char* data;        // first byte
  size_t size;
  const unsigned char* region;      // the mapping around it (guard pages included)
  size_t region_size;
};

void traffic_set_buffers(std::vector<TrafficBuffer> buffers, bool counting);
void traffic_begin_threadgroup(int lanes);
void traffic_lane_sync(int lane);  // the lane passed a barrier or a simd collective
void traffic_end_threadgroup(int simd_width);
// JSON: per buffer index, the totals over every threadgroup of the dispatch.
void traffic_write_report(const std::string& path);

// The runtime's current lane (-1 outside a kernel).
int current_lane_index();

}  // namespace metal_emu
