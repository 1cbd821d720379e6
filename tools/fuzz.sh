#!/usr/bin/env bash
# Builds the libFuzzer targets (CMake preset fuzz: clang, -fsanitize=fuzzer,address,undefined, into
# build/fuzz) and runs each for SECONDS (default 60), one per core side by side, over a copy of its seed
# corpus (fuzz/corpus/<target>,
# never written to), with its dictionary (fuzz/<target>.dict) and its own -max_len. Prints, per target,
# the executions, exec/s and coverage (cov: edges, ft: features, corp: units/bytes), and exits 1 if any
# target reported a finding (crash, sanitizer report, leak, timeout, out-of-memory), naming the input
# that caused it.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]       (targets: fuzz_npy fuzz_safetensors fuzz_checkpoint_config fuzz_run
#                                              fuzz_tokenizer_json; default all)
#
# Everything it writes goes to one folder, kept and printed at the end: $FUZZ_OUT if set, else a new
# /tmp/difftx-fuzz.XXXXXX. In it: <target>.log (libFuzzer's output), corpus/<target>/ (the seeds plus
# what the run found; pass it back as a corpus to go on), and the inputs of findings as
# <target>-crash-<sha1>, -leak-, -timeout- or -oom-. Replay one with `build/fuzz/fuzz/<target> FILE`
# (fuzz_run: with DIFFTX_FUZZ_VERBOSE=1 to see the command line and keep its files).
# Environment: FUZZ_TIMEOUT (seconds one input may take, default 25), FUZZ_RSS_MB (default 2048),
# CMAKE_BUILD_PARALLEL_LEVEL (build jobs).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "usage: tools/fuzz.sh [SECONDS] [TARGET...] (SECONDS: a positive integer, got '$seconds')" >&2; exit 2; }
(($# > 0)) && shift
all=(fuzz_npy fuzz_safetensors fuzz_checkpoint_config fuzz_run fuzz_tokenizer_json)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
# -max_len: a few times the largest seed (fuzz_run holds arguments and three files; fuzz_tokenizer_json's
# seeds are trimmed tokenizer.json files of up to 7 KB).
declare -A max_len=([fuzz_npy]=4096 [fuzz_safetensors]=8192 [fuzz_checkpoint_config]=8192 [fuzz_run]=16384
                    [fuzz_tokenizer_json]=16384)
for t in "${targets[@]}"; do
  [[ -v max_len[$t] ]] || { echo "tools/fuzz.sh: unknown target '$t' (targets: ${all[*]})" >&2; exit 2; }
done

out=${FUZZ_OUT:-$(mktemp -d /tmp/difftx-fuzz.XXXXXX)}
mkdir -p "$out/corpus" "$out/tmp"
out=$(cd "$out" && pwd)

start=$(date +%s)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
echo "fuzz build: $(($(date +%s) - start)) s"

# fuzz_one TARGET: runs it and writes its summary line to $out/TARGET.result (and the end of its log,
# on a finding). Targets run side by side, one per core (each libFuzzer process uses one thread).
fuzz_one() {
  local t=$1 log="$out/$1.log" rc=0
  rm -rf "$out/corpus/$t"
  cp -r "fuzz/corpus/$t" "$out/corpus/$t"
  TMPDIR="$out/tmp" UBSAN_OPTIONS=print_stacktrace=1 \
    "build/fuzz/fuzz/$t" "$out/corpus/$t" -dict="fuzz/$t.dict" -max_len="${max_len[$t]}" \
    -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-25}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" \
    -artifact_prefix="$out/$t-" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  local execs rate coverage result
  execs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  coverage=$(grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 || true)
  if ((rc == 0)); then
    result="ok"
  else
    local artifact kind
    artifact=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
    kind=$(grep -o -m1 'ERROR: libFuzzer: [a-z-]*\|ERROR: AddressSanitizer: [a-z-]*\|ERROR: LeakSanitizer: [a-z-]*\|runtime error: .*\|fuzz_run: finding: .*\|fuzz_[a-z_]*: [a-z].*' "$log" | head -1 || true)
    result="FINDING (exit $rc): ${kind:-see the log}; input: ${artifact:-none written}"
  fi
  echo "$t: ${execs:-?} executions, ${rate:-?} exec/s, ${coverage:-no coverage line}: $result" >"$out/$t.result"
}

jobs=$(nproc)
echo
echo "== ${targets[*]}: $seconds s each, $jobs at a time; corpus copies in $out/corpus"
running=0
for t in "${targets[@]}"; do
  if ((running == jobs)); then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait

summary=()
failed=0
for t in "${targets[@]}"; do
  line=$(cat "$out/$t.result")
  if [[ $line != *": ok" ]]; then
    failed=1
    echo "-- the end of $out/$t.log:"
    tail -n 60 "$out/$t.log"
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "== summary ($seconds s per target; logs, corpora and findings in $out)"
printf '%s\n' "${summary[@]}"
exit "$failed"
