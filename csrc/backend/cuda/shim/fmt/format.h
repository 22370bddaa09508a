// The part of {fmt} that MLX's CUDA headers use (fmt::format in an error message). The MLX wheels do not
// ship fmt, and these headers only need a readable string: the arguments are appended after the format.
#pragma once
#include <sstream>
#include <string>

namespace fmt {

template <typename... Args>
std::string format(const char* pattern, const Args&... args) {
  std::ostringstream os;
  os << pattern;
  ((os << " " << args), ...);
  return os.str();
}

}  // namespace fmt
