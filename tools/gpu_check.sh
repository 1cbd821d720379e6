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
# STEP is any of tests, memcheck, racecheck, bench, peers, models, ncu
# (default: the first five, in that order), or checks: tests, memcheck and
# racecheck side by side (they time nothing, so a short lease need not wait
# for each in turn). Each command's whole output goes to
# LOG_DIR/<name>.log; the summary printed last has one line per command: its
# exit status and seconds, added to LOG_DIR/summary.txt (a later call's line
# for the same command is the one that counts). Steps run on after a failure, so one call reports
# everything; the script exits 1 if any command failed.
#
# The tests step also runs the PyTorch extension's CUDA tests where python3
# imports a difftx extension built with CUDA (BUILD/python, from the wheel
# tools/gpu_pack.sh packs, or one installed there).
#
# For a short lease, in the environment:
#   DIFFTX_SANITIZER_CASES   doctest --test-case patterns for the sanitizers'
#                            cuda_test run (default: every case)
#   DIFFTX_SANITIZER_JOBS    sanitizer processes at once, each over its share
#                            of those cases (default 1); one log and summary
#                            line per sanitizer all the same
#   DIFFTX_CUDA_BENCH_FILTER --benchmark_filter for difftx_cuda_bench
#   DIFFTX_GPU_MODEL         the models step's DiffLlama folder (default: a
#                            1.16B one that tools/make_big_checkpoint.py
#                            writes to gpu_model/, under the current folder and
#                            ignored by git, in bfloat16)
#   DIFFTX_STEP_LIMIT        seconds any one command may run (default: no limit)
set -uo pipefail
usage="usage: tools/gpu_check.sh BUILD_DIR LOG_DIR [tests|memcheck|racecheck|checks|bench|peers|models|ncu]..."
build=${1:?$usage}
logs=${2:?$usage}
shift 2
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests memcheck racecheck bench peers)
for step in "${steps[@]}"; do  # before any device time is spent
  case $step in
    tests | memcheck | racecheck | checks | bench | peers | models | ncu) ;;
    *) echo "gpu_check: unknown step '$step' (tests, memcheck, racecheck, checks, bench, peers, models, ncu)" >&2; exit 2 ;;
  esac
done
repo=$(cd "$(dirname "$0")/.." && pwd)
# Libraries carried with packed binaries (tools/gpu_pack.sh), ahead of the system's.
[ -d "$build/lib" ] && export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The PyTorch extension tools/gpu_pack.sh --unpack installed there, if any.
[ -d "$build/python" ] && export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$logs"
lines=$logs/summary.lines  # a line per command, written by run (also from steps run side by side)
: >"$lines"

summarize() {  # summarize NAME STATUS START: NAME.log's tail, and NAME's summary line
  tail -n 8 "$logs/$1.log"
  printf '%-22s exit %3d  %5ds\n' "$1" "$2" $((SECONDS - $3)) >>"$lines"
}

run() {  # run NAME COMMAND...: logs to LOG_DIR/NAME.log, one summary line
  local name=$1 start=$SECONDS
  shift
  echo "== $name: $*"
  timeout "${DIFFTX_STEP_LIMIT:-0}" "$@" >"$logs/$name.log" 2>&1
  summarize "$name" $? "$start"
}

model=${DIFFTX_GPU_MODEL:-gpu_model}

# sanitize NAME ARGS...: compute-sanitizer ARGS over cuda_test's cases (those
# of DIFFTX_SANITIZER_CASES), in DIFFTX_SANITIZER_JOBS processes at once, each
# over every JOBS-th case; their outputs in turn in NAME.log, one summary line
# with the worst exit status.
sanitize() {
  local name=$1 jobs=${DIFFTX_SANITIZER_JOBS:-1} start=$SECONDS part worst=0 status i listed
  shift
  local filters=("${DIFFTX_SANITIZER_CASES:-*}")  # one process's --test-case, or each one's
  if [ "$jobs" -gt 1 ] && listed=$("$build/tests/cuda_test" --list-test-cases "--test-case=${filters[0]}"); then
    local cases=()  # doctest's filters split at commas and take ? for any character
    mapfile -t cases < <(grep -v -e '^\[doctest\]' -e '^====' -e '^$' <<<"$listed" | tr ',' '?')
    [ "$jobs" -gt "${#cases[@]}" ] && jobs=${#cases[@]}
    filters=()
    for ((part = 0; part < jobs; ++part)); do
      local share=()
      for ((i = part; i < ${#cases[@]}; i += jobs)); do share+=("${cases[i]}"); done
      filters+=("$(IFS=,; echo "${share[*]}")")
    done
  fi
  echo "== $name: compute-sanitizer $* over cuda_test in ${#filters[@]} processes"
  for part in "${!filters[@]}"; do
    (timeout "${DIFFTX_STEP_LIMIT:-0}" compute-sanitizer "$@" "$build/tests/cuda_test" "--test-case=${filters[part]}" \
      >"$logs/$name.part$part" 2>&1; echo $? >"$logs/$name.part$part.status") &
  done
  wait
  : >"$logs/$name.log"
  for part in "${!filters[@]}"; do
    cat "$logs/$name.part$part" >>"$logs/$name.log"
    status=$(cat "$logs/$name.part$part.status")
    [ "$status" -gt "$worst" ] && worst=$status
    rm -f "$logs/$name.part$part" "$logs/$name.part$part.status"
  done
  summarize "$name" "$worst" "$start"
}

tests() {
  run cuda_test "$build/tests/cuda_test"
  run nccl_test "$build/tests/nccl_test"
  run cli_test_gpu "$build/tests/cli_test" "--test-case=cli gpu:*"
  run check "$build/tools/difftx" check
  # The PyTorch extension on CUDA tensors, where python3 imports a difftx built with CUDA.
  if python3 -c "from difftx import _ext; assert _ext.has_cuda" 2>/dev/null; then
    run pytest_cuda python3 -m pytest -q -p no:cacheprovider "$repo/python/tests/test_cuda.py"
  fi
}
memcheck() { sanitize memcheck --tool memcheck --error-exitcode 1; }
# difftx's kernels only: racecheck reports hazards inside cuDNN's own sm90
# attention kernels (cuDNN 9.19), which are not ours to change.
racecheck() { sanitize racecheck --tool racecheck --error-exitcode 1 --kernel-name-exclude kns=cudnn; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
for step in "${steps[@]}"; do
  case $step in
    tests | memcheck | racecheck)
      "$step"
      ;;
    checks)
      tests >"$logs/tests.out" 2>&1 &
      memcheck >"$logs/memcheck.out" 2>&1 &
      racecheck >"$logs/racecheck.out" 2>&1 &
      wait
      cat "$logs/tests.out" "$logs/memcheck.out" "$logs/racecheck.out"
      rm -f "$logs/tests.out" "$logs/memcheck.out" "$logs/racecheck.out"
      ;;
    bench)
      run cuda_bench "$build/benchmarks/difftx_cuda_bench" --benchmark_filter="${DIFFTX_CUDA_BENCH_FILTER:-.}" \
        --benchmark_out="$logs/cuda_bench.json" --benchmark_out_format=json
      run bench_simd_cuda "$build/tools/difftx" bench --policy simd,cuda --module decoder_layer --batch 1 --seq 2048 \
        --d-model 3072 --heads 12 --dtype bfloat16 --backward --repeats 3
      ;;
    peers)
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
      # The attention op alone on cuDNN, differential and standard, forward +
      # backward at N = 4096: each kernel's time, cuDNN's and difftx's passes.
      for op in diff_attention attention; do
        run "ncu_$op" ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 30 \
          "$build/benchmarks/difftx_cuda_bench" \
          "--benchmark_filter=^op:$op/cuda/bfloat16/forward_backward/C:3072/N:4096/attention:cudnn/"
      done
      ;;
  esac
done
cat "$lines"
cat "$lines" >>"$logs/summary.txt"
failed=0
grep -qv ' exit   0 ' "$lines" && failed=1
rm -f "$lines"
exit "$failed"
