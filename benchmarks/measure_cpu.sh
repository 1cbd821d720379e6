#!/usr/bin/env bash
# The CPU measurements behind docs/benchmarks.md: runs each question's commands
# and writes benchmarks/results/<question>.json (machine, date, commands,
# tables, a reading); then `python3 benchmarks/render_benchmarks.py` writes the page.
#
#   benchmarks/measure_cpu.sh [question ...]     # default: all of them, about 15 minutes on 2 cores
#
# Questions: layers bfloat16 linear checkpoint generation lowbit v2 dynamic scaleout.
# Environment:
#   BUILD    a release build (default build/release): tools/difftx, benchmarks/difftx_bench,
#            benchmarks/difftx_parallel_bench, benchmarks/difftx_generation_bench; copied first, so a
#            rebuild cannot change them mid-run
#   PYTHON   a Python with torch and transformers for the peers (default python3); without
#            them the PyTorch columns say "not run"
#   THREADS  threads for every contender (default 2)
#   CKPT     a DiffLlama folder for "checkpoint" and "generation" (default: a random 375M-parameter llama3-RoPE
#            folder written by tools/make_big_checkpoint.py into the work folder)
#   QUIET    1 (default): before each question wait until no compiler, ninja or ctest has run
#            for 60 s (polled every 30 s; at most WAIT_BUDGET seconds of waiting in all, default
#            3600); 0: measure at once
#   OMP_WAIT_POLICY  passive unless set: idle OpenMP threads sleep (difftx's and PyTorch's alike).
#            Spinning threads are faster on an idle machine but lose badly to other processes
#            on a busy one, and a measurement should not depend on which it met
# Timings on a shared machine move; each reading says whether the machine was quiet.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build/release}
PYTHON=${PYTHON:-python3}
THREADS=${THREADS:-2}
QUIET=${QUIET:-1}
WAIT_BUDGET=${WAIT_BUDGET:-3600}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
questions=("$@")
((${#questions[@]})) || questions=(layers bfloat16 linear checkpoint generation lowbit v2 dynamic scaleout)

work=$(mktemp -d "${TMPDIR:-/tmp}/difftx-measure.XXXXXX")
keep=0  # a question that fails leaves the raw outputs for a look
trap '((keep)) && echo "measure_cpu: raw outputs kept in $work" >&2 || rm -rf "$work"' EXIT
mkdir -p "$work/bin" benchmarks/results
# The binaries as they are now (a build elsewhere may replace them while this runs).
for b in tools/difftx benchmarks/difftx_bench benchmarks/difftx_parallel_bench benchmarks/difftx_generation_bench; do
  for try in 1 2 3 4 5; do cp "$BUILD/$b" "$work/bin/" 2>/dev/null && break; sleep 20; done
done
difftx=$work/bin/difftx
bench=$work/bin/difftx_bench
has_peers=0
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi  # mpirun as root
"$PYTHON" -c 'import torch, transformers' 2>/dev/null && has_peers=1

# Wait for a quiet machine: no compiler (cc1plus, nvcc's cicc or ptxas), ninja or ctest in three polls 30 s
# apart. The waits of the whole run share WAIT_BUDGET; once it is spent, each
# question is measured at once. What it found goes to $o/quiet for collect_cpu.py.
echo 0 >"$work/waited"
wait_quiet() {
  [ "$QUIET" = 1 ] || { echo unchecked >"$o/quiet"; return; }
  local start=$SECONDS calm=0 waited
  waited=$(cat "$work/waited")
  while ((calm < 3)); do
    if [ "$(pgrep -c cc1plus || true)" = 0 ] && ! pgrep 'cicc|ptxas' >/dev/null && ! pgrep -f 'ctest|ninja' >/dev/null; then
      calm=$((calm + 1))
    else
      calm=0
    fi
    if ((calm < 3 && waited + SECONDS - start >= WAIT_BUDGET)); then
      echo "measure_cpu: the machine did not get quiet within $WAIT_BUDGET s of waiting; measuring anyway" >&2
      echo $((waited + SECONDS - start)) >"$work/waited"
      echo no >"$o/quiet"
      return
    fi
    ((calm < 3)) && sleep 30
  done
  echo $((waited + SECONDS - start)) >"$work/waited"
  echo yes >"$o/quiet"
}

# run OUT CMD...: CMD's stdout into OUT, the command as a reader would type it into OUT.cmd.
run() {
  local out=$1 shown="" a
  shift
  for a in "$@"; do [[ $a =~ ^[A-Za-z0-9_./:=,+-]+$ ]] && shown+="$a " || shown+="'$a' "; done
  printf '%s\n' "${shown% }" | sed -e "s#$work/bin/difftx_parallel_bench#build/release/benchmarks/difftx_parallel_bench#g" \
    -e "s#$work/bin/difftx_generation_bench#build/release/benchmarks/difftx_generation_bench#g" -e "s#=${CKPT:-$work/ckpt} #=CKPT #g" \
    -e "s#$work/bin/difftx_bench#build/release/benchmarks/difftx_bench#g" -e "s#$work/bin/difftx#build/release/tools/difftx#g" \
    -e "s#$work/ckpt#CKPT#g" -e "s#--model ${CKPT:-$work/ckpt} #--model CKPT #g" -e "s# --out $work/[^ ]*##" -e "s# --binary build/release/benchmarks/difftx_bench##" \
    -e "s#^$PYTHON #python3 #" -e "s#^env ##" >>"$out.cmd"
  "$@" >>"$out"
}

collect() {  # question: its raw outputs -> benchmarks/results/<question>.json
  QUIET_STATE=$(cat "$work/$1/quiet" 2>/dev/null || echo unchecked) LOAD=$(cut -d' ' -f1-3 /proc/loadavg) THREADS=$THREADS HAS_PEERS=$has_peers DIFFTX=$difftx \
    "$PYTHON" benchmarks/collect_cpu.py "$1" "$work/$1" >"benchmarks/results/$1.json.new"
  mv "benchmarks/results/$1.json.new" "benchmarks/results/$1.json"
  echo "measure_cpu: wrote benchmarks/results/$1.json" >&2
}

shape=(--batch 1 --seq 2048 --d-model 768 --heads 6)
decode=(--decode --module decoder_layer --batch 1 --context 4096 --d-model 2048 --heads 16 --ffn-dim 5632 --repeats 10 --json)

# The 375M folder of "checkpoint" and "generation" into ckpt: CKPT, or a random one written once into the
# work folder (its command into $o/make.cmd).
big_checkpoint() {
  if [ -n "${CKPT:-}" ]; then ckpt=$CKPT; return; fi
  ckpt=$work/ckpt
  printf '%s\n' "python3 tools/make_big_checkpoint.py --out CKPT --layers 16 --hidden 1024 --heads 16 --kv-heads 4 --head-dim 64 --intermediate 4096 --vocab 128256 --tie --rope-type llama3 --rope-theta 500000" >"$o/make.cmd"
  [ -d "$ckpt" ] && return
  ((has_peers)) || { echo "measure_cpu: $1 needs CKPT or a Python with torch" >&2; return 1; }
  "$PYTHON" tools/make_big_checkpoint.py --out "$ckpt" --layers 16 --hidden 1024 --heads 16 --kv-heads 4 \
    --head-dim 64 --intermediate 4096 --vocab 128256 --tie --rope-type llama3 --rope-theta 500000 >&2
}

measure() {  # question: its commands, outputs under $work/<question>
  o=$work/$1
  mkdir -p "$o"
  case $1 in
    layers)  # MultiHead against PyTorch's two recipes, and the attention op against SGEMM
      wait_quiet
      if ((has_peers)); then
        run "$o/peer.txt" "$PYTHON" benchmarks/peer_pytorch.py --threads "$THREADS" --lengths 512 2048 --repeats 3 \
          --min-time 0.5 --binary "$bench" --out "$o"
      fi ;;
    bfloat16)  # the same modules in float32 and bfloat16
      wait_quiet
      for m in multihead swiglu decoder_layer; do
        for t in float32 bfloat16; do
          run "$o/$m.$t.json" "$difftx" bench --module "$m" "${shape[@]}" --dtype "$t" --backward --repeats 3 \
            --threads "$THREADS" --json
        done
      done ;;
    linear)  # Linear's products: difftx's own, oneDNN's matmul, PyTorch
      wait_quiet
      run "$o/difftx_bench.json" env OMP_NUM_THREADS="$THREADS" "$bench" \
        '--benchmark_filter=op:linear/simd/.*/(difftx|onednn|onednn_packed)/' --benchmark_min_time=0.5 --benchmark_format=json
      if ((has_peers)); then
        run "$o/peer.json" "$PYTHON" benchmarks/peer_pytorch_linear.py --threads "$THREADS"
      fi ;;
    checkpoint)  # a DiffLlama folder: difftx bench --model against transformers' generate
      big_checkpoint "$1" || return 1
      wait_quiet
      for t in float32 bfloat16; do
        run "$o/difftx.$t.json" "$difftx" bench --model "$ckpt" --seq 512 --new-tokens 32 --repeats 3 --dtype "$t" \
          --threads "$THREADS" --json
        if ((has_peers)); then
          run "$o/peer.$t.txt" "$PYTHON" benchmarks/peer_transformers_generate.py --model "$ckpt" --dtype "$t" \
            --threads "$THREADS" --prompt-tokens 512 --new-tokens 32 --repeats 3
        fi
      done
      # int8 weights (no transformers peer on the CPU): the decode's share of its read bound; bfloat16 with
      # its products converted to float (--bf16-product converting), the path automatic leaves on CPUs
      # without AVX512_BF16, against the dot-product instruction's
      run "$o/difftx.int8.json" "$difftx" bench --model "$ckpt" --seq 512 --new-tokens 32 --repeats 3 --dtype float32 \
        --weights-dtype int8 --threads "$THREADS" --json
      run "$o/difftx.bfloat16-converting.json" "$difftx" bench --model "$ckpt" --seq 512 --new-tokens 32 --repeats 3 \
        --dtype bfloat16 --bf16-product converting --threads "$THREADS" --json
      # The share again with threads that spin between parallel regions, as libgomp's default waiting does
      # for gaps of microseconds (a decode step opens about a hundred regions; a sleeping thread's wake-up
      # is paid at each).
      for row in "float32 float32 same automatic" "bfloat16 bfloat16 same automatic" "int8 float32 int8 automatic" \
        "bfloat16-converting bfloat16 same converting"; do  # name, dtype, weights, bfloat16 products
        read -r name dtype weights products <<<"$row"
        run "$o/difftx.$name.spinning.json" env OMP_WAIT_POLICY=active "$difftx" bench --model "$ckpt" --seq 512 \
          --new-tokens 32 --repeats 3 --dtype "$dtype" --weights-dtype "$weights" --bf16-product "$products" \
          --threads "$THREADS" --json
      done
      # The products alone against a plain read of their bytes, by matrix size (a step's are 1 to 32 MB, its
      # head 128 to 512 MB), with sleeping and with spinning threads: what the step's share owes its kernels
      for policy in passive active; do
        run "$o/products.$policy.json" env OMP_NUM_THREADS="$THREADS" OMP_WAIT_POLICY=$policy \
          "$work/bin/difftx_generation_bench" '--benchmark_filter=^decode_product/' --benchmark_min_time=0.5 \
          --benchmark_repetitions=3 --benchmark_format=json
      done ;;
    generation)  # the sampler chain at V = 128256; 8 prompts at once against one at a time, and transformers'
      big_checkpoint "$1" || return 1
      wait_quiet
      g=$work/bin/difftx_generation_bench
      run "$o/sampler.json" env OMP_NUM_THREADS="$THREADS" "$g" '--benchmark_filter=^sampler/' --benchmark_min_time=0.5 \
        --benchmark_repetitions=3 --benchmark_format=json
      run "$o/generate.json" env OMP_NUM_THREADS="$THREADS" DIFFTX_BENCH_MODEL="$ckpt" "$g" '--benchmark_filter=^generate/' \
        --benchmark_repetitions=5 --benchmark_format=json
      if grep -qw amx_bf16 /proc/cpuinfo; then  # the same without AMX tiles (policy::simd::amx_tiles off)
        run "$o/generate.no-amx.json" env OMP_NUM_THREADS="$THREADS" DIFFTX_BENCH_MODEL="$ckpt" DIFFTX_BENCH_AMX=0 "$g" \
          '--benchmark_filter=^generate/' --benchmark_repetitions=5 --benchmark_format=json
      fi
      if ((has_peers)); then
        for b in 1 8; do
          run "$o/peer.$b.txt" "$PYTHON" benchmarks/peer_transformers_generate.py --model "$ckpt" --dtype bfloat16 \
            --threads "$THREADS" --prompt-tokens 512 --new-tokens 64 --repeats 3 --batch "$b"
        done
      fi ;;
    lowbit)  # a decode step in float32, bfloat16 and int8; int8 Q·Kᵀ in the forward
      wait_quiet
      for t in 1 "$THREADS"; do
        run "$o/f32.$t.json" "$difftx" bench "${decode[@]}" --threads "$t"
        run "$o/bf16.$t.json" "$difftx" bench "${decode[@]}" --threads "$t" --dtype bfloat16
        run "$o/int8.$t.json" "$difftx" bench "${decode[@]}" --threads "$t" --weights-dtype int8 --kv-dtype int8
        run "$o/w8.$t.json" "$difftx" bench "${decode[@]}" --threads "$t" --weights-dtype int8
        run "$o/kv8.$t.json" "$difftx" bench "${decode[@]}" --threads "$t" --kv-dtype int8
      done
      for qk in same int8; do
        run "$o/qk.$qk.json" "$difftx" bench --module multihead "${shape[@]}" --repeats 5 --threads "$THREADS" \
          --qk-dtype "$qk" --json
      done ;;
    v2)  # differential attention V2 against V1 and the matched baseline
      wait_quiet
      run "$o/difftx_bench.json" env OMP_NUM_THREADS="$THREADS" "$bench" \
        '--benchmark_filter=^(MultiHeadV2|MultiHead|Attention)/simd/float32/(forward|forward_backward)/N:(512|2048)/' \
        --benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_format=json ;;
    dynamic)  # the run-time head size against a compiled one
      wait_quiet
      run "$o/difftx_bench.json" env OMP_NUM_THREADS="$THREADS" "$bench" '--benchmark_filter=/simd/.*/D:(compiled|dynamic)/' \
        --benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_format=json ;;
    scaleout)  # one DecoderLayer: 1 process, 1 and 2 threads, against 2 MPI ranks
      wait_quiet
      p=$work/bin/difftx_parallel_bench
      run "$o/t1.json" env OMP_NUM_THREADS=1 "$p" --benchmark_repetitions=3 --benchmark_format=json
      run "$o/t2.json" env OMP_NUM_THREADS=2 "$p" --benchmark_repetitions=3 --benchmark_format=json
      run "$o/mpi.json" env OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe "$p" --benchmark_repetitions=3 --benchmark_format=json ;;
    *) echo "measure_cpu: no question '$1' (layers bfloat16 linear checkpoint generation lowbit v2 dynamic scaleout)" >&2; return 2 ;;
  esac
}

failed=()
for q in "${questions[@]}"; do
  echo "measure_cpu: $q ($(date +%T))" >&2
  set +e
  (set -e; measure "$q") && (set -e; collect "$q")
  rc=$?
  set -e
  ((rc == 0)) || { failed+=("$q"); keep=1; }
done
((${#failed[@]} == 0)) || { echo "measure_cpu: failed: ${failed[*]}" >&2; exit 1; }
