#!/bin/sh
# The quick start's benchmark table: `difftx bench` on a fixed set of shapes,
# forward and forward + backward, as one Markdown table (a second on simd, about
# 30 s on the reference policy, on 2 cores). Where the tool has policy::cuda and
# a device is present, and no --policy is given, each shape gets a cuda row too.
#   tools/bench_table.sh [path/to/difftx [more bench flags, e.g. --policy reference]]
set -eu
difftx=${1:-build/release/tools/difftx}
[ $# -gt 0 ] && shift

# bench exits 2 for --policy cuda where the tool lacks it or no device is found.
gpu=""
case " $* " in
  *" --policy"*) ;;
  *) "$difftx" bench --policy cuda --module rmsnorm --batch 1 --seq 1 --d-model 8 --repeats 1 >/dev/null 2>&1 && gpu=cuda ;;
esac

# One value of the one-line JSON object `bench --json` prints (keys are unique).
field() { printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"; }

echo "| module | policy | threads | dtype | B | N | C | heads | D | forward ms | fwd+bwd ms | tokens/s fwd | GFLOP/s fwd | GFLOP/s fwd+bwd |"
echo "|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
# module dtype B N C heads: a differential layer with h heads of 2 x D and its
# matched baseline (attention with 2h heads of D) at the same width.
while read -r module dtype batch seq width heads; do
  for policy in default $gpu; do
    [ "$policy" = default ] && policy_flag="" || policy_flag="--policy $policy"
    # shellcheck disable=SC2086  # policy_flag is zero or two words
    json=$("$difftx" bench --module "$module" --dtype "$dtype" --batch "$batch" --seq "$seq" --d-model "$width" \
           --heads "$heads" --backward --repeats 3 --json $policy_flag "$@")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.0f | %.2f | %.2f |\n' "$module" \
      "$(field "$json" policy)" "$(field "$json" threads)" "$dtype" "$batch" "$seq" "$width" "$heads" "$(field "$json" head_dim)" \
      "$(field "$json" forward_ms)" "$(field "$json" forward_backward_ms)" "$(field "$json" forward_tokens_per_s)" \
      "$(field "$json" forward_gflops)" "$(field "$json" forward_backward_gflops)"
  done
done <<SHAPES
multihead float32 1 256 256 4
attention float32 1 256 256 8
decoder_layer float32 1 256 256 4
decoder_layer bfloat16 1 256 256 4
decoder_layer float32 2 512 256 4
SHAPES
