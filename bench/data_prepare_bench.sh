#!/bin/bash
# Throughput of `trainctl data prepare` against Debian's spm_encode on the same text and the
# same SentencePiece model, in the same run.
#   bench/data_prepare_bench.sh [BIN_DIR]      (default build/bin)
# The corpus: the fortune files of Debian's `fortunes` (the non-.dat, non-.u8 files under
# /usr/share/games/fortunes), concatenated and repeated to about $WEFT_BENCH_MB MB (32), so
# the timings are long enough to be stable. A BPE model of 4096 pieces is trained on one copy.
# Both sides read the same file: prepare splits it into fortunes at "%" lines and encodes them
# on every core, writing binary shards; spm_encode encodes line by line on one core and prints
# ids as text. Prints
#   BENCH data_prepare mb_per_s=M tokens_per_s=T vs_spm_encode=R ...
#   R: prepare's throughput / spm_encode's (the goal, issue 15: >= 1.5 on 2 cores).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$(cd "${1:-$ROOT/build/bin}" && pwd)
MB=${WEFT_BENCH_MB:-32}
command -v spm_encode >/dev/null || {
  echo "data_prepare_bench: spm_encode is missing (apt-get install sentencepiece)" >&2
  exit 2
}
WORK=$(mktemp -d /tmp/weft-prepare-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
source "$ROOT/bench/fortunes_corpus.sh"
fortunes_corpus data_prepare_bench "$WORK" "$MB" || exit 2
BYTES=$(stat -c %s "$WORK/corpus.txt")

"$BIN/trainctl" data train-tokenizer --out "$WORK/tok.model" --vocab-size 4096 \
  --doc-separator % "$WORK/once.txt" >/dev/null

now() { date +%s.%N; }
# Warm the page cache so that neither side pays for the first read.
cat "$WORK/corpus.txt" >/dev/null

t0=$(now)
spm_encode --model "$WORK/tok.model" --output_format=id <"$WORK/corpus.txt" >"$WORK/spm.txt"
t1=$(now)
"$BIN/trainctl" -o json data prepare --out "$WORK/dataset" --tokenizer "$WORK/tok.model" \
  --doc-separator % --val-fraction 0 --quiet "$WORK/corpus.txt" >"$WORK/prepare.json"
t2=$(now)

TOKENS=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["train_tokens"] + r["val_tokens"])' "$WORK/prepare.json")
SPM_TOKENS=$(wc -w <"$WORK/spm.txt")
awk -v bytes="$BYTES" -v tokens="$TOKENS" -v spm_tokens="$SPM_TOKENS" \
    -v t0="$t0" -v t1="$t1" -v t2="$t2" -v cores="$(nproc)" 'BEGIN {
  spm_s = t1 - t0; prep_s = t2 - t1
  printf "BENCH data_prepare mb_per_s=%.2f tokens_per_s=%.0f vs_spm_encode=%.2f", \
    bytes / prep_s / 1e6, tokens / prep_s, spm_s / prep_s
  printf " spm_encode_mb_per_s=%.2f corpus_mb=%.1f tokens=%d spm_encode_tokens=%d cores=%d\n", \
    bytes / spm_s / 1e6, bytes / 1e6, tokens, spm_tokens, cores
}'
