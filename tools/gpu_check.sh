#!/usr/bin/env bash
# Every check that needs a CUDA device, in one go, for a machine lent for a
# short while: the gpu-labelled suites (cuda_test, nccl_test on one rank, the
# tool's gpu cases), `difftx check` with its cuda rows, compute-sanitizer's
# memcheck and racecheck over cuda_test, then the timings (difftx_cuda_bench
# beside PyTorch on the same GPU, `difftx bench --policy simd,cuda`), a
# language model on the GPU through the tool beside transformers' generate,
# and Nsight Compute's view of the kernels that are difftx's own.
#
#   tools/gpu_check.sh BUILD_DIR LOG_DIR [STEP...]
#
# BUILD_DIR: a build folder, made there or packed here and unpacked there
# (tools/gpu_pack.sh, which says how).
# STEP is any of tests, memcheck, racecheck, bench, models, ncu (default: the
# first four, in that order). Each command's whole output goes to
# LOG_DIR/<name>.log; the summary printed last has one line per command: its
# exit status and seconds. Steps run on after a failure, so one call reports
# everything; the script exits 1 if any command failed.
#
# For a short lease, in the environment:
#   DIFFTX_SANITIZER_CASES   doctest --test-case patterns for the sanitizers'
#                            cuda_test run (default: every case)
#   DIFFTX_CUDA_BENCH_FILTER --benchmark_filter for difftx_cuda_bench
#   DIFFTX_GPU_MODEL         the models step's DiffLlama folder (default: a
#                            1.16B one that tools/make_big_checkpoint.py
#                            writes to gpu_model/, under the current folder and
#                            ignored by git, in bfloat16)
#   DIFFTX_STEP_LIMIT        seconds any one command may run (default: no limit)
set -uo pipefail
usage="usage: tools/gpu_check.sh BUILD_DIR LOG_DIR [tests|memcheck|racecheck|bench|models|ncu]..."
build=${1:?$usage}
logs=${2:?$usage}
shift 2
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests memcheck racecheck bench)
for step in "${steps[@]}"; do  # before any device time is spent
  case $step in
    tests | memcheck | racecheck | bench | models | ncu) ;;
    *) echo "gpu_check: unknown step '$step' (tests, memcheck, racecheck, bench, models, ncu)" >&2; exit 2 ;;
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
  timeout "${DIFFTX_STEP_LIMIT:-0}" "$@" >"$logs/$name.log" 2>&1
  status=$?
  [ "$status" -ne 0 ] && failed=1
  tail -n 8 "$logs/$name.log"
  summary+=("$(printf '%-22s exit %3d  %5ds' "$name" "$status" $((SECONDS - start)))")
}

sanitized_cases=()
[ -n "${DIFFTX_SANITIZER_CASES:-}" ] && sanitized_cases=("--test-case=$DIFFTX_SANITIZER_CASES")
model=${DIFFTX_GPU_MODEL:-gpu_model}

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
      run memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/cuda_test" "${sanitized_cases[@]}"
      ;;
    racecheck)
      # difftx's kernels only: racecheck reports hazards inside cuDNN's own
      # sm90 attention kernels (cuDNN 9.19), which are not ours to change.
      run racecheck compute-sanitizer --tool racecheck --error-exitcode 1 --kernel-name-exclude kns=cudnn \
        "$build/tests/cuda_test" "${sanitized_cases[@]}"
      ;;
    bench)
      run cuda_bench "$build/benchmarks/difftx_cuda_bench" --benchmark_filter="${DIFFTX_CUDA_BENCH_FILTER:-.}" \
        --benchmark_out="$logs/cuda_bench.json" --benchmark_out_format=json
      run bench_simd_cuda "$build/tools/difftx" bench --policy simd,cuda --module decoder_layer --batch 1 --seq 2048 \
        --d-model 3072 --heads 12 --dtype bfloat16 --backward --repeats 3
      # PyTorch's recipes beside those results: the tables for docs/benchmarks.md, and LOG_DIR/benchmarks_gpu.json
      PYTHONUNBUFFERED=1 run peer_pytorch_gpu python3 "$repo/benchmarks/peer_pytorch_gpu.py" \
        --difftx-json "$logs/cuda_bench.json" --backends flash cudnn --out "$logs"
      ;;
    models)
      # A 1B DiffLlama folder on the GPU and on the host's cores in one table,
      # then transformers' generate (bfloat16, sdpa) on the same GPU and folder.
      [ -f "$model/config.json" ] ||
        run make_checkpoint python3 "$repo/tools/make_big_checkpoint.py" --out "$model" --dtype bfloat16
      run bench_model "$build/tools/difftx" bench --model "$model" --policy simd,cuda --dtype bfloat16 --seq 512 \
        --new-tokens 64 --repeats 2
      run bench_model_json "$build/tools/difftx" bench --model "$model" --policy cuda --dtype bfloat16 --seq 512 \
        --new-tokens 64 --repeats 3 --json
      PYTHONUNBUFFERED=1 run transformers_generate python3 "$repo/benchmarks/peer_transformers_generate.py" \
        --model "$model" --dtype bfloat16 --device cuda --attn sdpa --prompt-tokens 512 --new-tokens 64 --repeats 3
      ;;
    ncu)
      # difftx's own kernels (namespace difftx) in one DecoderLayer forward and
      # backward at the 3B shape; cuBLASLt's and cuDNN's are left out.
      run ncu ncu --clock-control none --kernel-name-base demangled --kernel-name regex:difftx:: --launch-count 60 \
        --section SpeedOfLight --csv "$build/tools/difftx" bench --policy cuda --module decoder_layer --batch 1 \
        --seq 2048 --d-model 3072 --heads 12 --dtype bfloat16 --backward --repeats 1
      ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
exit "$failed"
