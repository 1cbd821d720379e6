#!/usr/bin/env bash
# Every check that needs a CUDA device, in one go, for a machine lent for a
# short while: the gpu-labelled suites (cuda_test, nccl_test on one rank, the
# tool's gpu cases), `difftx check` with its cuda rows, compute-sanitizer's
# memcheck and racecheck over cuda_test, then the timings (difftx_cuda_bench
# beside PyTorch on the same GPU, `difftx bench --policy simd,cuda`).
#
#   tools/gpu_check.sh BUILD_DIR LOG_DIR [STEP...]
#
# BUILD_DIR: a build folder, made there or packed here and unpacked there
# (tools/gpu_pack.sh, which says how).
# STEP is any of tests, memcheck, racecheck, bench (default: all four, in that
# order). Each command's whole output goes to LOG_DIR/<name>.log; the summary
# printed last has one line per command: its exit status and seconds. Steps
# run on after a failure, so one call reports everything; the script exits 1
# if any command failed.
set -uo pipefail
build=${1:?usage: tools/gpu_check.sh BUILD_DIR LOG_DIR [tests|memcheck|racecheck|bench]...}
logs=${2:?usage: tools/gpu_check.sh BUILD_DIR LOG_DIR [tests|memcheck|racecheck|bench]...}
shift 2
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests memcheck racecheck bench)
for step in "${steps[@]}"; do  # before any device time is spent
  case $step in
    tests | memcheck | racecheck | bench) ;;
    *) echo "gpu_check: unknown step '$step' (tests, memcheck, racecheck, bench)" >&2; exit 2 ;;
  esac
done
repo=$(cd "$(dirname "$0")/.." && pwd)
# Libraries carried with packed binaries (tools/gpu_pack.sh), ahead of the system's.
[ -d "$build/lib" ] && export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$logs"
summary=()
failed=0

run() {  # run NAME COMMAND...: logs to LOG_DIR/NAME.log, one summary line
  local name=$1 start=$SECONDS status
  shift
  echo "== $name: $*"
  "$@" >"$logs/$name.log" 2>&1
  status=$?
  [ "$status" -ne 0 ] && failed=1
  tail -n 8 "$logs/$name.log"
  summary+=("$(printf '%-22s exit %3d  %5ds' "$name" "$status" $((SECONDS - start)))")
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
for step in "${steps[@]}"; do
  case $step in
    tests)
      run cuda_test "$build/tests/cuda_test"
      run nccl_test "$build/tests/nccl_test"
      run cli_test_gpu "$build/tests/cli_test" "--test-case=cli gpu:*"
      run check "$build/tools/difftx" check
      ;;
    memcheck)
      run memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/cuda_test"
      ;;
    racecheck)
      # difftx's kernels only: racecheck reports hazards inside cuDNN's own
      # sm90 attention kernels (cuDNN 9.19), which are not ours to change.
      run racecheck compute-sanitizer --tool racecheck --error-exitcode 1 --kernel-name-exclude kns=cudnn \
        "$build/tests/cuda_test"
      ;;
    bench)
      run cuda_bench "$build/benchmarks/difftx_cuda_bench" \
        --benchmark_out="$logs/cuda_bench.json" --benchmark_out_format=json
      run bench_simd_cuda "$build/tools/difftx" bench --policy simd,cuda --module decoder_layer --batch 1 --seq 2048 \
        --d-model 3072 --heads 12 --dtype bfloat16 --backward --repeats 3
      # PyTorch's recipes beside those results: the tables for docs/benchmarks.md, and LOG_DIR/benchmarks_gpu.json
      PYTHONUNBUFFERED=1 run peer_pytorch_gpu python3 "$repo/benchmarks/peer_pytorch_gpu.py" \
        --difftx-json "$logs/cuda_bench.json" --backends flash cudnn --out "$logs"
      ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
exit "$failed"
