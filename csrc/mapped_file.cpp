#include "csrc/mapped_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "csrc/utils.h"

#ifndef _WIN32
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace mlx_ggml_ext {

namespace {

// How array() hands the mapped bytes to MLX; chosen once per file by probing.
enum class Sharing {
  // The allocator wrapped the mapping in one buffer of its own (Metal's
  // make_buffer); arrays share it at byte offsets.
  allocator_buffer,
  // MLX's CPU-only allocator: a buffer pointer is a size_t header followed by the
  // data, and raw_ptr() is the address after the header. The mapping reserves a
  // page in front of the file, so a valid header sits right before the file's
  // first byte and arrays address the file through it.
  header_before_file,
  // Neither works (e.g. the CUDA allocator): MLX's constructor with a deleter copies.
  copy,
};

}  // namespace

struct MappedFile::Mapping {
  std::string path;
  uint8_t* region = nullptr;  // the reserved page, then the file's pages
  size_t region_bytes = 0;
  const uint8_t* file = nullptr;
  uint64_t size = 0;
  Sharing sharing = Sharing::copy;
  mx::allocator::Buffer allocator_buffer{nullptr};

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();
};

#ifdef _WIN32

MappedFile::Mapping::~Mapping() = default;

static void map_file(MappedFile::Mapping&, const std::string& path) {
  throw std::runtime_error(
      cat("[MappedFile] memory-mapped loading is not implemented on Windows yet ('", path, "')."));
}

#else

MappedFile::Mapping::~Mapping() {
  if (allocator_buffer.ptr() != nullptr) mx::allocator::release(allocator_buffer);
  if (region != nullptr) munmap(region, region_bytes);
}

namespace {

struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) close(fd);
  }
};

[[noreturn]] void throw_os_error(const std::string& what, const std::string& path) {
  const int code = errno;
  throw mapped_file_os_error(cat("[MappedFile] ", what, " '", path, "': ", std::strerror(code)), code);
}

}  // namespace

static void map_file(MappedFile::Mapping& m, const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is then rejected below).
  FileDescriptor f{open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) throw_os_error("cannot open", path);
  struct stat st;
  if (fstat(f.fd, &st) != 0) throw_os_error("cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    throw_os_error("cannot map", path);
  }
  if (!S_ISREG(st.st_mode)) {
    throw std::invalid_argument(cat("[MappedFile] '", path, "' is not a regular file."));
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > std::numeric_limits<size_t>::max() - 2 * page) {
    throw std::invalid_argument(cat("[MappedFile] '", path, "' is too large to map (", size, " bytes)."));
  }
  const size_t file_pages = (size + page - 1) / page * page;
  m.region_bytes = page + file_pages;
  void* region = mmap(nullptr, m.region_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
  if (region == MAP_FAILED) throw_os_error("cannot reserve address space for", path);
  m.region = static_cast<uint8_t*>(region);
  // The file goes right after the reserved page (the mapping owns `region` from
  // here on and unmaps it on failure). Copy-on-write: MLX's buffer protocol hands
  // numpy writable views of any array, and a write must neither reach the file nor
  // fault on a read-only page. Where the system will not commit memory for a private
  // writable mapping (strict overcommit), map read-only instead.
  if (size > 0) {
    void* file = mmap(m.region + page, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, f.fd, 0);
    if (file == MAP_FAILED && errno == ENOMEM) {
      file = mmap(m.region + page, size, PROT_READ, MAP_SHARED | MAP_FIXED, f.fd, 0);
    }
    if (file == MAP_FAILED) throw_os_error("cannot map", path);
  }
  *reinterpret_cast<size_t*>(m.region + page - sizeof(size_t)) = size;
  mprotect(m.region, page, PROT_READ);
  m.file = m.region + page;
  m.size = size;
}

#endif

namespace {

mx::array make_shared_array(const std::shared_ptr<MappedFile::Mapping>& m, mx::allocator::Buffer buffer,
                            uint64_t offset, const mx::Shape& shape, uint64_t nbytes) {
  // Not owned by the allocator, so MLX never donates (writes into) these pages.
  return array_over_buffer(buffer, [keep = m](mx::allocator::Buffer) {}, static_cast<int64_t>(offset), shape, nbytes);
}

// Whether an array built with `sharing` addresses the file's bytes in place.
bool sharing_works(const std::shared_ptr<MappedFile::Mapping>& m, mx::allocator::Buffer buffer) {
  auto probe = make_shared_array(m, buffer, 0, mx::Shape{0}, 0);
  return probe.data<uint8_t>() == m->file;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : mapping_(std::make_shared<Mapping>()) {
  mapping_->path = path;
  map_file(*mapping_, path);

  // A GPU allocator that can wrap host memory (Metal) gets the whole mapping at once:
  // the mapping starts on a page boundary and spans whole pages.
  const size_t mapped = mapping_->region_bytes - static_cast<size_t>(mapping_->file - mapping_->region);
  auto wrapped = mapped > 0 ? mx::allocator::make_buffer(const_cast<uint8_t*>(mapping_->file), mapped)
                            : mx::allocator::Buffer{nullptr};
  if (wrapped.ptr() != nullptr) {
    mapping_->allocator_buffer = wrapped;
    if (sharing_works(mapping_, wrapped)) mapping_->sharing = Sharing::allocator_buffer;
    return;
  }
#if defined(MLX_GGML_EXT_BACKEND_CPU)
  mx::allocator::Buffer header{const_cast<uint8_t*>(mapping_->file) - sizeof(size_t)};
  if (sharing_works(mapping_, header)) mapping_->sharing = Sharing::header_before_file;
#endif
}

const std::string& MappedFile::path() const { return mapping_->path; }
uint64_t MappedFile::size() const { return mapping_->size; }
const uint8_t* MappedFile::data() const { return mapping_->file; }
bool MappedFile::zero_copy() const { return mapping_->sharing != Sharing::copy; }
std::shared_ptr<const void> MappedFile::keep_alive() const { return mapping_; }

void MappedFile::prefault() const {
#ifndef _WIN32
  const uint8_t* file = mapping_->file;
  const uint64_t size = mapping_->size;
  if (size == 0) return;
#ifdef MADV_POPULATE_READ
  // Linux 5.14+: page-table entries for every page in one call, reading the file where it is not cached. A read
  // populate: the private mapping's pages stay shared with the page cache (a write populate would copy them).
  if (madvise(const_cast<uint8_t*>(file), size, MADV_POPULATE_READ) == 0) return;
#endif
  // Elsewhere (older kernels, macOS): one read per page does the same.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uint8_t sum = 0;
  for (uint64_t at = 0; at < size; at += page) sum ^= *static_cast<const volatile uint8_t*>(file + at);
  asm volatile("" : : "r"(sum));
#endif
}

void MappedFile::check_range(uint64_t offset, uint64_t nbytes) const {
  if (offset > mapping_->size || nbytes > mapping_->size - offset) {
    throw std::invalid_argument(cat("[MappedFile] bytes [", offset, ", ", offset, " + ", nbytes,
                                    ") lie outside '", mapping_->path, "' (", mapping_->size, " bytes)."));
  }
}

std::string MappedFile::bytes(uint64_t offset, uint64_t nbytes) const {
  check_range(offset, nbytes);
  return std::string(reinterpret_cast<const char*>(mapping_->file + offset), nbytes);
}

uint64_t MappedFile::non_negative(int64_t v, const char* what) {
  if (v < 0) throw std::invalid_argument(cat("[MappedFile] ", what, " must be >= 0, got ", v, "."));
  return static_cast<uint64_t>(v);
}

mx::array MappedFile::array(uint64_t offset, const std::vector<int64_t>& dims) const {
  mx::Shape shape;
  uint64_t nbytes = 1;  // saturates at the maximum: the range check then fails
  for (auto d : dims) {
    if (d < 0 || d > std::numeric_limits<mx::ShapeElem>::max()) {
      throw std::invalid_argument(cat("[MappedFile] dimension ", d, " is outside [0, ",
                                      std::numeric_limits<mx::ShapeElem>::max(), "]."));
    }
    shape.push_back(static_cast<mx::ShapeElem>(d));
  }
  for (auto d : shape) {
    const auto n = static_cast<uint64_t>(d);
    if (n == 0) {
      nbytes = 0;
      break;
    }
    nbytes = nbytes > std::numeric_limits<uint64_t>::max() / n ? std::numeric_limits<uint64_t>::max() : nbytes * n;
  }
  check_range(offset, nbytes);
  const auto& m = mapping_;
  switch (m->sharing) {
    case Sharing::allocator_buffer:
      return make_shared_array(m, m->allocator_buffer, offset, shape, nbytes);
    case Sharing::header_before_file:
      return make_shared_array(m, mx::allocator::Buffer{const_cast<uint8_t*>(m->file) - sizeof(size_t)},
                               offset, shape, nbytes);
    case Sharing::copy:
      break;
  }
  return mx::array(const_cast<uint8_t*>(m->file + offset), shape, mx::uint8, [keep = m](void*) {});
}

}  // namespace mlx_ggml_ext
