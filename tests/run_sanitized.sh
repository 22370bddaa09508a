#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   tests/run_sanitized.sh [pytest arguments]     (default: the whole tests/ folder)
#
# Builds the extension with -DMLX_GGML_EXT_SANITIZE=ON into build/asan (kernels at -O1), stages the package
# with that module in build/asan/stage, and runs pytest there with libasan (and libstdc++, which the
# sanitizer's C++ interceptors need before Python loads any C++ module) preloaded into Python. The CUDA and
# Metal kernel emulators (tests/test_cuda_emulation.py, tests/test_metal_emulation.py) compile their kernels
# with the same sanitizers (MLX_GGML_EXT_EMU_CXXFLAGS), so a GPU kernel's read past a buffer is caught on the
# host too. Any report ends the run with a non-zero status (halt_on_error); leaks are not checked (Python
# and MLX keep allocations alive until exit by design).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python}
BUILD=${SANITIZE_BUILD_DIR:-$ROOT/build/asan}

cmake -S . -B "$BUILD" -G Ninja -DPython_EXECUTABLE="$(command -v "$PY")" -DMLX_GGML_EXT_SANITIZE=ON \
      -DMLX_GGML_EXT_BACKEND=cpu -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$BUILD" -j"${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

stage="$BUILD/stage/mlx_ggml_ext"
rm -rf "$BUILD/stage"
mkdir -p "$stage"
# Every source file and subpackage (models/) of the package, but not the dev build's module link.
for f in "$ROOT"/mlx_ggml_ext/*; do
  case "$f" in *.so|*/__pycache__) ;; *) ln -s "$f" "$stage/" ;; esac
done
ln -s "$BUILD"/_ext*.so "$stage/"

libasan=$(g++ -print-file-name=libasan.so)
libstdcxx=$(g++ -print-file-name=libstdc++.so)
export LD_PRELOAD="$libasan:$libstdcxx"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export MLX_GGML_EXT_EMU_CXXFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer"
export MLX_GGML_EXT_DEVICE=cpu
export PYTHONPATH="$BUILD/stage${PYTHONPATH:+:$PYTHONPATH}"
# The staged package, not the source tree's: pytest runs from the stage with the tests given by path, and
# -p no:cacheprovider keeps it from writing into the checkout.
cd "$BUILD/stage"
"$PY" -c "import mlx_ggml_ext, sys; assert mlx_ggml_ext.__file__.startswith('$BUILD/stage'), mlx_ggml_ext.__file__"
if [[ $# -eq 0 ]]; then set -- "$ROOT/tests"; fi
exec "$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" "$@"
