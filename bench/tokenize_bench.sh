#!/bin/bash
# Throughput of a Hugging Face byte-level BPE tokenizer.json in Weft (`trainctl data prepare
# --tokenizer X.json`, worker/data/bpe_tokenizer.h) against the `tokenizers` Python package
# (the PyPI wheel, Rust underneath) on the same documents and cores, in the same run.
#   bench/tokenize_bench.sh [BIN_DIR] [TOKENIZER_JSON]      (default build/bin)
# The corpus: Debian's fortunes concatenated and repeated to about $WEFT_BENCH_MB MB (16),
# documents cut at "%" lines. Without TOKENIZER_JSON, a Llama 3 style tokenizer of
# $WEFT_BENCH_VOCAB (32000) tokens is trained on one copy with the wheel (Llama 3's split
# pattern, ignore_merges). The wheel goes into a virtual environment of its own
# (WEFT_BENCH_TOKENIZERS_VERSION, 0.23.3). Both sides are checked to give the same number of
# tokens. Prepare's time is end to end (reading, encoding on every core, writing shards); the
# wheel's is encode_batch alone (its threads: every core). Prints
#   BENCH tokenize mb_per_s=M tokens_per_s=T vs_hf_tokenizers=R hf_mb_per_s=... tokens=...
#   R: Weft's throughput / the wheel's (issue 40's goal: >= 1.5 on 2 cores).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$(cd "${1:-$ROOT/build/bin}" && pwd)
MB=${WEFT_BENCH_MB:-16}
WORK=$(mktemp -d /tmp/weft-tokenize-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
source "$ROOT/bench/fortunes_corpus.sh"
tokenizers_venv tokenize_bench "$WORK" || exit 2
fortunes_corpus tokenize_bench "$WORK" "$MB" || exit 2
BYTES=$(stat -c %s "$WORK/corpus.txt")

TOKENIZER=${2:-}
if [[ -z $TOKENIZER ]]; then
  TOKENIZER=$WORK/tokenizer.json
  "$WORK/venv/bin/python" - "$WORK/once.txt" "$TOKENIZER" "${WEFT_BENCH_VOCAB:-32000}" <<'PY'
import sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
text, out, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
docs = open(text, encoding="utf-8", errors="replace").read().split("\n%\n")
tok.train_from_iterator(docs, trainers.BpeTrainer(
    vocab_size=vocab, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(out)
PY
fi

now() { date +%s.%N; }
cat "$WORK/corpus.txt" >/dev/null  # the page cache warm for both
t0=$(now)
"$BIN/trainctl" -o json data prepare --out "$WORK/dataset" --tokenizer "$TOKENIZER" \
  --doc-separator % --val-fraction 0 --quiet "$WORK/corpus.txt" >"$WORK/prepare.json"
t1=$(now)
TOKENS=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["train_tokens"] + r["val_tokens"])' "$WORK/prepare.json")
# The same documents prepare encodes (trainctl/data_inputs.h): the text between "%" lines,
# each with its last newline, without empty ones.
read -r HF_S HF_TOKENS < <(RAYON_NUM_THREADS=$(nproc) "$WORK/venv/bin/python" - \
    "$WORK/corpus.txt" "$TOKENIZER" "$ROOT/bench" <<'PY'
import sys, time
from tokenizers import Tokenizer
sys.path.insert(0, sys.argv[3])
import fortunes_docs
tok = Tokenizer.from_file(sys.argv[2])
docs = fortunes_docs.read_documents(sys.argv[1])
start = time.perf_counter()
out = tok.encode_batch(docs, add_special_tokens=False)
seconds = time.perf_counter() - start
print(f"{seconds:.4f} {sum(len(e.ids) for e in out)}")
PY
)
awk -v bytes="$BYTES" -v tokens="$TOKENS" -v hf_tokens="$HF_TOKENS" -v hf_s="$HF_S" \
    -v t0="$t0" -v t1="$t1" -v cores="$(nproc)" 'BEGIN {
  s = t1 - t0
  printf "BENCH tokenize mb_per_s=%.2f tokens_per_s=%.0f vs_hf_tokenizers=%.2f", \
    bytes / s / 1e6, tokens / s, hf_s / s
  printf " hf_mb_per_s=%.2f corpus_mb=%.1f tokens=%d hf_tokens=%d cores=%d\n", \
    bytes / hf_s / 1e6, bytes / 1e6, tokens, hf_tokens, cores
}'
