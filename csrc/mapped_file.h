// A read-only memory map of a whole file whose bytes can be handed to MLX as
// uint8 arrays without a copy (the GGUF loader's tensors).
//
// Every array made by array() keeps the mapping alive through a shared_ptr held
// by its buffer's deleter; the file is unmapped when the MappedFile and the last
// such array are gone. Offsets and lengths are checked against the file size.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mlx/mlx.h"

namespace mlx_ggml_ext {

namespace mx = mlx::core;

// The file could not be opened, inspected or mapped: `error_code` is the errno
// (POSIX) so the bindings can raise the matching OSError subclass.
struct mapped_file_os_error : std::runtime_error {
  mapped_file_os_error(const std::string& what, int error_code)
      : std::runtime_error(what), error_code(error_code) {}
  int error_code;
};

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);

  const std::string& path() const;
  uint64_t size() const;
  // First byte of the file in memory (valid while this object or an array lives).
  const uint8_t* data() const;
  // True when array() shares the mapped pages with MLX; false when the MLX
  // allocator in use cannot wrap foreign memory and array() copies.
  bool zero_copy() const;

  // Throws std::invalid_argument unless [offset, offset + nbytes) lies in the file.
  void check_range(uint64_t offset, uint64_t nbytes) const;
  // A copy of bytes [offset, offset + nbytes).
  std::string bytes(uint64_t offset, uint64_t nbytes) const;
  // A byte offset or count from Python: a ValueError naming `what` when negative.
  static uint64_t non_negative(int64_t v, const char* what);
  // A uint8 array of shape `dims` over bytes [offset, offset + prod(dims)); every
  // dimension must fit MLX's int32 shape elements.
  mx::array array(uint64_t offset, const std::vector<int64_t>& dims) const;
  // Keeps the mapping alive (for views handed to Python).
  std::shared_ptr<const void> keep_alive() const;
  // Maps every page of the file into the process now (llama.cpp maps with MAP_POPULATE for the same reason):
  // otherwise each page faults on its first read, and a mixture of experts' decode tokens keep touching experts
  // for the first time (555 minor faults a token in the first 32 tokens of an 8 x 128-expert model).
  void prefault() const;

  struct Mapping;

 private:
  std::shared_ptr<Mapping> mapping_;
};

}  // namespace mlx_ggml_ext
