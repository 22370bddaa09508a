#!/usr/bin/env bash
# One GPU-machine session for the CUDA build. Needs, next to the working tree, the files of the GPU machine's own
# tooling (not part of this repository): .gpu/b, .gpu/on-device.sh and .gpu/wheels. On that machine run
#   STEPS="info tests memcheck bench" bash bench/device_session.sh
# It sets MLX up when the machine is fresh, installs test dependencies from .gpu/wheels when the machine
# lacks them (fill it first: pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 -d .gpu/wheels gguf hypothesis sortedcontainers attrs tqdm pyyaml pytest
# iniconfig pluggy packaging), builds, then runs each step (tests: the whole suite with MLX_GGML_EXT_DEVICE=gpu; memcheck:
# compute-sanitizer on $MEMCHECK_ARGS; bench: bench_cuda.py; ncu: kernel-only times through
# Nsight Compute, bench/kernel_times.py; NCU_METRICS replaces its metric list, which must keep the three it has),
# writing logs under $OUT. SKIP_BUILD=1 reuses what an earlier call
# on the same warm machine built.
set -uo pipefail
# A representative GPU subset for compute-sanitizer (every kernel, every type, vector tails), unless given.
MEMCHECK_ARGS=${MEMCHECK_ARGS:-"-k 'random_bytes or every_cpu_kernel_variant or quantized_matmul'"}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# The GPU machine's g++ (/opt/gcc) and ld disagree on LTO ("could not run lto-wrapper" at the module's link,
# seen again 2026-11-25): build without it there. CUDAARCHS=90 builds for Hopper only (one architecture of two).
export CMAKE_ARGS="${CMAKE_ARGS:-} -DMLX_GGML_EXT_LTO=OFF"
if [[ ! -d /root/mlx-site/mlx ]]; then bash .gpu/on-device.sh setup || exit 1; fi
if [[ ! -d /root/testdeps ]]; then
  missing=()
  for m in pytest gguf hypothesis yaml; do python3 -c "import $m" 2>/dev/null || missing+=($m); done
  echo "test deps missing on device: ${missing[*]:-none}"
  mkdir -p /root/testdeps
  [[ ${#missing[@]} -gt 0 && -d .gpu/wheels ]] && python3 -m pip install -q --no-index --no-deps --target /root/testdeps .gpu/wheels/*.whl
fi
t0=$(date +%s)
if [[ ${SKIP_BUILD:-0} == 1 && -d /root/proj-site/mlx_ggml_ext ]]; then
  echo "build skipped (SKIP_BUILD=1): the package an earlier call of this warm machine built"
else
  bash .gpu/on-device.sh build > "$OUT/build.log" 2>&1; rc=$?
  echo "build rc=$rc in $(( $(date +%s) - t0 )) s"; grep -iE "error|warning" "$OUT/build.log" | head -30
  [[ $rc -eq 0 ]] || { tail -40 "$OUT/build.log"; exit 1; }
fi
R() { bash .gpu/on-device.sh run "PYTHONPATH=\$PYTHONPATH:/root/testdeps $*"; }
for step in ${STEPS:-tests}; do
  t0=$(date +%s)
  case $step in
    info) R 'nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv; python3 -c "import mlx.core as mx, mlx_ggml_ext as m; print(mx.__version__, m.backends())"' ;;
    tests) R "MLX_GGML_EXT_DEVICE=gpu timeout ${TEST_TIMEOUT:-400} python3 -m pytest \$SRC/tests -q -x -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee $OUT/pytest-gpu.log | tail -40" ;;
    cputests) R "timeout 300 python3 -m pytest \$SRC/tests -q -p no:cacheprovider ${PYTEST_CPU_ARGS:-} 2>&1 | tee $OUT/pytest-cpu.log | tail -15" ;;
    memcheck) R "CS=\$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1); echo \$CS; MLX_GGML_EXT_DEVICE=gpu timeout ${MEMCHECK_TIMEOUT:-240} \$CS --tool memcheck --error-exitcode 9 python3 -m pytest \$SRC/tests -q -x -p no:cacheprovider ${MEMCHECK_ARGS:-} > $OUT/memcheck.log 2>&1; echo memcheck rc=\$?; tail -25 $OUT/memcheck.log" ;;
    bench) R "cd \$SRC/bench && timeout ${BENCH_TIMEOUT:-300} python3 bench_cuda.py ${BENCH_ARGS:-} 2>&1 | tee $OUT/bench.json" ;;
    ncu) R "NCU=\$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo ncu: \$NCU; cd \$SRC/bench && timeout ${NCU_TIMEOUT:-240} \$NCU --profile-from-start off --clock-control none --print-units base --csv --page raw --metrics ${NCU_METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum} python3 kernel_times.py > $OUT/ncu.csv 2> $OUT/ncu.err; echo ncu rc=\$?; tail -3 $OUT/ncu.err; python3 kernel_times.py --parse $OUT/ncu.csv | tee $OUT/kernel_times.json" ;;
    *) R "$step" ;;
  esac
  echo "== step $step took $(( $(date +%s) - t0 )) s"
done
