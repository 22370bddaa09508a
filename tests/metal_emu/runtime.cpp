// The Metal emulator's runtime: runs one kernel dispatch on the CPU with Metal's execution model.
//
// - Threadgroups run one after another; the lanes of a threadgroup are fibers (ucontext) on one OS thread.
//   A lane runs until it reaches a synchronization point (threadgroup_barrier, a simd_* collective,
//   simdgroup_barrier) or returns; then the next lane runs. The order in which lanes run between two
//   synchronization points is shuffled with the job's seed, so a missing barrier (a lane reading what
//   another has not yet written) gives wrong results for some seeds instead of passing by luck.
// - threadgroup_barrier releases when every lane of the threadgroup has arrived; a lane that returned
//   while others wait at a barrier is reported (undefined on the GPU). A simd collective resolves when
//   every lane of the simdgroup that has not returned has arrived at the same collective; lanes waiting at
//   different collectives, or at a barrier, are reported as divergence.
// - Device buffers start 128-byte aligned (a memory line; Metal's buffers are page-aligned) and end at
//   most 127 bytes before a guard page (PROT_NONE). Every access of the kernels is checked byte-exact
//   against its buffer (traffic.h); an access the instrumentation misses still faults at the guard page,
//   and the bytes around a buffer are canaries, checked after the run for stray writes.
// - Threadgroup memory is filled with 0xFF bytes (NaN for floats) at the start of every threadgroup, and
//   limited to Metal's 32 KiB per threadgroup; at most 1024 threads per threadgroup.
//
// Usage: metal_emu JOB, where JOB is a text file of lines:
//   kernel NAME | groups X Y Z | threads X Y Z | seed N | buffer INDEX PATH | threadgroup INDEX BYTES
//   | alias INDEX OTHER (binds buffer OTHER at INDEX too: an output donated its input's memory)
//   | traffic PATH (count the device loads, traffic.h, and write their totals to PATH as JSON)
// Every buffer is read from PATH and written back to PATH.out after the dispatch.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "emu_api.h"
#include "traffic.h"

namespace metal_emu {
namespace {

constexpr size_t kMaxThreadgroupBytes = 32768;
constexpr uint32_t kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kFiberStack = 256 * 1024;
constexpr unsigned char kCanary = 0xA5;

std::map<std::string, Launcher>& registry() {
  static std::map<std::string, Launcher> r;
  return r;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "metal_emu: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// A buffer whose (128-byte rounded) end touches a guard page, with a guard page before the mapping too.
struct GuardedBuffer {
  std::string name;
  size_t size = 0;
  unsigned char* mapping = nullptr;
  size_t mapping_size = 0;
  unsigned char* data = nullptr;

  void allocate(const std::string& label, size_t bytes) {
    name = label;
    size = bytes;
    const size_t page = page_size();
    const size_t body = round_up(std::max<size_t>(round_up(bytes, 128), 1), page);
    mapping_size = body + 2 * page;
    void* m = mmap(nullptr, mapping_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap failed");
    mapping = static_cast<unsigned char*>(m);
    if (mprotect(mapping + page, body, PROT_READ | PROT_WRITE) != 0) die("mprotect failed");
    std::memset(mapping + page, kCanary, body);
    data = mapping + page + body - round_up(bytes, 128);
  }
  TrafficBuffer traffic(int index) const { return {name, index, data, size, mapping, mapping_size}; }
  bool contains_guard(const void* addr) const {
    const auto* a = static_cast<const unsigned char*>(addr);
    return a >= mapping && a < mapping + mapping_size;
  }
  // Stray writes into the canary bytes around the buffer (inside the accessible pages).
  void check_canaries() const {
    const unsigned char* begin = mapping + page_size();
    const unsigned char* end = mapping + mapping_size - page_size();
    for (const unsigned char* p = begin; p < end; ++p) {
      if (p >= data && p < data + size) continue;
      if (*p != kCanary) {
        die("write outside " + name + " (size " + std::to_string(size) + ") at byte offset " +
            std::to_string(p - data));
      }
    }
  }
};

std::vector<GuardedBuffer*> g_guarded;

void on_fault(int, siginfo_t* info, void*) {
  char msg[256];
  for (const GuardedBuffer* b : g_guarded) {
    if (b->contains_guard(info->si_addr)) {
      const long offset = static_cast<long>(static_cast<const unsigned char*>(info->si_addr) - b->data);
      std::snprintf(msg, sizeof msg, "metal_emu: out-of-bounds access to %s (size %zu) at byte offset %ld\n",
                    b->name.c_str(), b->size, offset);
      (void)!write(2, msg, std::strlen(msg));
      _exit(4);
    }
  }
  const char* other = "metal_emu: segmentation fault outside every buffer's guard pages\n";
  (void)!write(2, other, std::strlen(other));
  _exit(5);
}

void install_fault_handler() {
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

enum class LaneState { ready, at_barrier, at_simd, done };

struct Lane {
  ucontext_t context;
  LaneState state = LaneState::ready;
  Invocation invocation{};
  SimdSlot slot{};
  SimdResolver resolver = nullptr;
  const char* collective = nullptr;
};

// Every lane's stack, with a PROT_NONE page below each (an overflow faults instead of corrupting a
// neighbour); mapped lazily, so unused stack pages cost nothing.
struct LaneStacks {
  unsigned char* base = nullptr;
  size_t stride = 0;
  void allocate(size_t lanes) {
    stride = kFiberStack + page_size();
    void* m = mmap(nullptr, stride * lanes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die("mmap of the lane stacks failed");
    base = static_cast<unsigned char*>(m);
    for (size_t i = 0; i < lanes; ++i) mprotect(base + i * stride, page_size(), PROT_NONE);
  }
  void* stack(size_t lane) const { return base + lane * stride + page_size(); }
};

struct Threadgroup {
  Launcher launcher = nullptr;
  std::vector<Lane> lanes;
  LaneStacks stacks;
  ucontext_t scheduler;
  int current = -1;
};

Threadgroup* g_group = nullptr;

void lane_entry() {
  Lane& lane = g_group->lanes[g_group->current];
  g_group->launcher(lane.invocation);
  lane.state = LaneState::done;
  // returning switches to uc_link: the scheduler
}

Lane& current_lane() {
  if (!g_group || g_group->current < 0) die("a synchronization built-in was called outside a kernel");
  return g_group->lanes[g_group->current];
}

void yield_to_scheduler(Lane& lane) { swapcontext(&lane.context, &g_group->scheduler); }

std::string lane_name(int index) { return "thread " + std::to_string(index) + " of the threadgroup"; }

// Resolves every simdgroup whose live lanes all wait at one collective; reports divergence. Returns true
// when something was released.
bool resolve_simdgroups(Threadgroup& g) {
  bool released = false;
  const int n = static_cast<int>(g.lanes.size());
  for (int first = 0; first < n; first += kSimdWidth) {
    const int last = std::min(n, first + kSimdWidth);
    int waiting = 0, live = 0;
    SimdResolver resolver = nullptr;
    for (int i = first; i < last; ++i) {
      const Lane& l = g.lanes[i];
      if (l.state == LaneState::done) continue;
      ++live;
      if (l.state != LaneState::at_simd) continue;
      ++waiting;
      if (resolver && l.resolver != resolver) {
        die(std::string("simdgroup divergence: lanes wait at different collectives (") +
            g.lanes[first].collective + " / " + l.collective + ")");
      }
      resolver = l.resolver;
    }
    if (waiting == 0) continue;
    if (waiting != live) {
      die(std::string("simdgroup divergence: some lanes wait at ") + "a collective, others at a barrier");
    }
    SimdSlot slots[kSimdWidth];
    for (int i = 0; i < kSimdWidth; ++i) {
      const int index = first + i;
      if (index < last && g.lanes[index].state == LaneState::at_simd) {
        slots[i] = g.lanes[index].slot;
        slots[i].active = true;
      } else {
        slots[i] = SimdSlot{};
        slots[i].active = false;
      }
    }
    resolver(slots);
    for (int i = first; i < last; ++i) {
      Lane& l = g.lanes[i];
      if (l.state != LaneState::at_simd) continue;
      std::memcpy(l.slot.out, slots[i - first].out, sizeof l.slot.out);
      l.state = LaneState::ready;
    }
    released = true;
  }
  return released;
}

void run_threadgroup(Threadgroup& g, std::mt19937& rng) {
  const int n = static_cast<int>(g.lanes.size());
  for (int i = 0; i < n; ++i) {
    Lane& lane = g.lanes[i];
    lane.state = LaneState::ready;
    getcontext(&lane.context);
    lane.context.uc_stack.ss_sp = g.stacks.stack(i);
    lane.context.uc_stack.ss_size = kFiberStack;
    lane.context.uc_link = &g.scheduler;
    makecontext(&lane.context, lane_entry, 0);
  }
  std::vector<int> order(n);
  for (;;) {
    order.clear();
    for (int i = 0; i < n; ++i)
      if (g.lanes[i].state == LaneState::ready) order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
      g.current = i;
      swapcontext(&g.scheduler, &g.lanes[i].context);
    }
    g.current = -1;
    int done = 0, at_barrier = 0;
    for (const Lane& l : g.lanes) {
      done += l.state == LaneState::done;
      at_barrier += l.state == LaneState::at_barrier;
    }
    if (done == n) return;
    if (resolve_simdgroups(g)) continue;
    if (at_barrier + done == n) {
      if (done > 0) {
        for (int i = 0; i < n; ++i)
          if (g.lanes[i].state == LaneState::done)
            die("threadgroup_barrier not reached by every thread: " + lane_name(i) + " returned before it");
      }
      for (Lane& l : g.lanes) l.state = LaneState::ready;
      continue;
    }
    die("deadlock: no lane can proceed");
  }
}

struct Job {
  std::string kernel;
  U3 groups{1, 1, 1}, threads{1, 1, 1};
  unsigned seed = 0;
  std::map<int, std::string> buffer_paths;
  std::map<int, int> aliases;
  std::map<int, size_t> threadgroup_bytes;
  std::string traffic_path;
};

Job read_job(const char* path) {
  std::ifstream in(path);
  if (!in) die(std::string("cannot read job ") + path);
  Job job;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key)) continue;
    if (key == "kernel") {
      ls >> job.kernel;
    } else if (key == "groups") {
      ls >> job.groups.x >> job.groups.y >> job.groups.z;
    } else if (key == "threads") {
      ls >> job.threads.x >> job.threads.y >> job.threads.z;
    } else if (key == "seed") {
      ls >> job.seed;
    } else if (key == "buffer") {
      int index;
      ls >> index >> job.buffer_paths[index];
    } else if (key == "alias") {
      int index;
      ls >> index >> job.aliases[index];
    } else if (key == "traffic") {
      ls >> job.traffic_path;
    } else if (key == "threadgroup") {
      int index;
      ls >> index >> job.threadgroup_bytes[index];
    } else {
      die("unknown job line: " + line);
    }
  }
  return job;
}

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die("cannot read " + path);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const unsigned char* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) die("cannot write " + path);
}

template <typename Map>
int slots_needed(const Map& m) {
  return m.empty() ? 0 : m.rbegin()->first + 1;
}

int run(const Job& job) {
  auto it = registry().find(job.kernel);
  if (it == registry().end()) die("no kernel named " + job.kernel + " in this build");
  const uint32_t per_group = job.threads.x * job.threads.y * job.threads.z;
  if (per_group == 0 || per_group > kMaxThreadsPerThreadgroup) {
    die("threads per threadgroup must be 1.." + std::to_string(kMaxThreadsPerThreadgroup));
  }
  size_t tg_total = 0;
  for (const auto& [index, bytes] : job.threadgroup_bytes) {
    if (bytes % 16 != 0) die("threadgroup memory length must be a multiple of 16 bytes (Metal's rule)");
    tg_total += bytes;
  }
  if (tg_total > kMaxThreadgroupBytes) die("threadgroup memory above 32 KiB");

  std::vector<GuardedBuffer> buffers(slots_needed(job.buffer_paths));
  std::vector<void*> buffer_ptrs(std::max(buffers.size(), size_t(slots_needed(job.aliases))), nullptr);
  for (const auto& [index, path] : job.buffer_paths) {
    const auto bytes = read_file(path);
    buffers[index].allocate("buffer(" + std::to_string(index) + ")", bytes.size());
    if (!bytes.empty()) std::memcpy(buffers[index].data, bytes.data(), bytes.size());
    buffer_ptrs[index] = buffers[index].data;
  }
  for (const auto& [index, other] : job.aliases) {
    if (other >= static_cast<int>(buffers.size()) || !buffers[other].data) die("alias of an unbound buffer");
    buffer_ptrs[index] = buffer_ptrs[other];
  }
  std::vector<GuardedBuffer> tg_memory(slots_needed(job.threadgroup_bytes));
  std::vector<void*> tg_ptrs(tg_memory.size(), nullptr);
  for (const auto& [index, bytes] : job.threadgroup_bytes) {
    tg_memory[index].allocate("threadgroup(" + std::to_string(index) + ")", bytes);
    tg_ptrs[index] = tg_memory[index].data;
  }
  for (auto& b : buffers) g_guarded.push_back(&b);
  for (auto& b : tg_memory) g_guarded.push_back(&b);
  std::vector<TrafficBuffer> checked;
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].data) checked.push_back(buffers[i].traffic(static_cast<int>(i)));
  for (auto& b : tg_memory)
    if (b.data) checked.push_back(b.traffic(-1));
  traffic_set_buffers(std::move(checked), !job.traffic_path.empty());
  install_fault_handler();

  Threadgroup group;
  group.launcher = it->second;
  group.lanes.resize(per_group);
  group.stacks.allocate(per_group);
  g_group = &group;
  std::mt19937 rng(job.seed);

  const U3 grid_threads{job.groups.x * job.threads.x, job.groups.y * job.threads.y, job.groups.z * job.threads.z};
  const uint32_t simdgroups = (per_group + kSimdWidth - 1) / kSimdWidth;
  // Threadgroups in a shuffled order as well: nothing may depend on their order.
  std::vector<U3> group_ids;
  for (uint32_t z = 0; z < job.groups.z; ++z)
    for (uint32_t y = 0; y < job.groups.y; ++y)
      for (uint32_t x = 0; x < job.groups.x; ++x) group_ids.push_back({x, y, z});
  std::shuffle(group_ids.begin(), group_ids.end(), rng);
  for (const U3& gid : group_ids) {
    for (auto& t : tg_memory) std::memset(t.data, 0xFF, t.size);
    for (uint32_t i = 0; i < per_group; ++i) {
      const U3 tid{i % job.threads.x, i / job.threads.x % job.threads.y, i / (job.threads.x * job.threads.y)};
      Invocation& inv = group.lanes[i].invocation;
      inv.buffers = buffer_ptrs.data();
      inv.n_buffers = static_cast<int>(buffer_ptrs.size());
      inv.tg_memory = tg_ptrs.data();
      inv.n_tg_memory = static_cast<int>(tg_ptrs.size());
      inv.thread_position_in_threadgroup = tid;
      inv.threadgroup_position_in_grid = gid;
      inv.thread_position_in_grid = {gid.x * job.threads.x + tid.x, gid.y * job.threads.y + tid.y,
                                     gid.z * job.threads.z + tid.z};
      inv.threads_per_threadgroup = job.threads;
      inv.threadgroups_per_grid = job.groups;
      inv.threads_per_grid = grid_threads;
      inv.thread_index_in_threadgroup = i;
      inv.thread_index_in_simdgroup = i % kSimdWidth;
      inv.simdgroup_index_in_threadgroup = i / kSimdWidth;
      inv.simdgroups_per_threadgroup = simdgroups;
      inv.threads_per_simdgroup = kSimdWidth;
    }
    traffic_begin_threadgroup(static_cast<int>(per_group));
    run_threadgroup(group, rng);
    traffic_end_threadgroup(kSimdWidth);
  }
  if (!job.traffic_path.empty()) traffic_write_report(job.traffic_path);
  g_group = nullptr;
  for (const auto& b : buffers)
    if (b.data) b.check_canaries();
  for (const auto& b : tg_memory)
    if (b.data) b.check_canaries();
  for (const auto& [index, path] : job.buffer_paths) {
    write_file(path + ".out", buffers[index].data, buffers[index].size);
  }
  return 0;
}

}  // namespace

Registration::Registration(const char* host_name, Launcher launcher) {
  if (!registry().emplace(host_name, launcher).second) die(std::string("kernel registered twice: ") + host_name);
}

SimdSlot& simd_collective(SimdResolver resolve, const char* name, const void* in, size_t size, int64_t arg) {
  Lane& lane = current_lane();
  if (size > sizeof lane.slot.in) die("simd collective payload too large");
  if (size) std::memcpy(lane.slot.in, in, size);
  lane.slot.arg = arg;
  lane.resolver = resolve;
  lane.collective = name;
  lane.state = LaneState::at_simd;
  traffic_lane_sync(g_group->current);
  yield_to_scheduler(lane);
  return lane.slot;
}

void threadgroup_barrier_wait() {
  Lane& lane = current_lane();
  lane.state = LaneState::at_barrier;
  traffic_lane_sync(g_group->current);
  yield_to_scheduler(lane);
}

void fail(const char* what) { die(what); }

int current_lane_index() { return g_group ? g_group->current : -1; }

}  // namespace metal_emu

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s JOB\n", argv[0]);
    return 2;
  }
  return metal_emu::run(metal_emu::read_job(argv[1]));
}
