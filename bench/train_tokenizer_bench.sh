#!/bin/bash
# Training a byte-level BPE tokenizer.json in Weft (`trainctl data train-tokenizer --kind
# tokenizer.json`, worker/data/bpe_trainer.h) against the `tokenizers` Python package's
# BpeTrainer (the PyPI wheel, Rust underneath) on the same documents, vocabulary size and
# cores, in the same run.
#   bench/train_tokenizer_bench.sh [BIN_DIR]      (default build/bin)
# The corpus: Debian's fortunes concatenated and repeated to about $WEFT_BENCH_MB MB (20),
# documents cut at "%" lines. Style $WEFT_BENCH_STYLE (llama3: Llama 3's split pattern) and
# $WEFT_BENCH_VOCAB tokens (32000), min_frequency 2 on both sides. The wheel goes into a virtual
# environment of its own (WEFT_BENCH_TOKENIZERS_VERSION, 0.23.3). Weft's time is trainctl end
# to end (reading the files, training, writing and reloading the tokenizer); the wheel's is
# train_from_iterator alone, its threads every core. Both files are compared: same_merges says
# whether the two learned the same merges in the same order. Prints
#   BENCH train_tokenizer mb=M vocab=V weft_s=W hf_s=H vs_hf=R ...
#   R: the wheel's time / Weft's (above 1: Weft is faster); tokens: the vocabulary Weft reached
#   (below V when the text runs out of pairs seen twice); words: distinct pre-tokens.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$(cd "${1:-$ROOT/build/bin}" && pwd)
MB=${WEFT_BENCH_MB:-20}
VOCAB=${WEFT_BENCH_VOCAB:-32000}
STYLE=${WEFT_BENCH_STYLE:-llama3}
WORK=$(mktemp -d /tmp/weft-train-tokenizer-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
source "$ROOT/bench/fortunes_corpus.sh"
tokenizers_venv train_tokenizer_bench "$WORK" || exit 2
fortunes_corpus train_tokenizer_bench "$WORK" "$MB" || exit 2
BYTES=$(stat -c %s "$WORK/corpus.txt")

now() { date +%s.%N; }
cat "$WORK/corpus.txt" >/dev/null  # the page cache warm for both
t0=$(now)
"$BIN/trainctl" -o json data train-tokenizer --kind tokenizer.json --style "$STYLE" \
  --vocab-size "$VOCAB" --min-frequency 2 --doc-separator % --out "$WORK/weft" \
  "$WORK/corpus.txt" >"$WORK/weft.json"
t1=$(now)
read -r COUNT_S MERGE_S WORDS TOKENS < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print("%.2f %.2f %d %d" % (r["count_seconds"], r["merge_seconds"], r["words"], r["vocab_size"]))
' "$WORK/weft.json")

# The same documents train-tokenizer reads (trainctl/data_inputs.h): the text between "%"
# lines, each with its last newline, without empty ones; the style as bpe_trainer.h writes it.
read -r HF_S SAME < <(RAYON_NUM_THREADS=$(nproc) "$WORK/venv/bin/python" - \
    "$WORK/corpus.txt" "$WORK/weft/tokenizer.json" "$VOCAB" "$STYLE" "$ROOT/bench" <<'PY'
import json, sys, time
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
corpus, weft_path, vocab, style = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, sys.argv[5])
import fortunes_docs
docs = fortunes_docs.read_documents(corpus)
weft = json.load(open(weft_path, encoding="utf-8"))
specials = [a["content"] for a in weft["added_tokens"]]
# The pre-tokenizer and normalizer objects of Weft's own file: the wheel splits as it does.
loaded = Tokenizer.from_str(json.dumps(weft))
tok = Tokenizer(models.BPE(ignore_merges=weft["model"]["ignore_merges"]))
tok.pre_tokenizer = loaded.pre_tokenizer
if loaded.normalizer is not None:
    tok.normalizer = loaded.normalizer
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=specials,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
start = time.perf_counter()
tok.train_from_iterator(docs, trainer)
seconds = time.perf_counter() - start
theirs = json.loads(tok.to_str())["model"]["merges"]
print(f"{seconds:.3f} {'yes' if theirs == weft['model']['merges'] else 'no'}")
PY
)
awk -v bytes="$BYTES" -v vocab="$VOCAB" -v hf_s="$HF_S" -v t0="$t0" -v t1="$t1" \
    -v count_s="$COUNT_S" -v merge_s="$MERGE_S" -v words="$WORDS" -v same="$SAME" \
    -v tokens="$TOKENS" -v style="$STYLE" -v cores="$(nproc)" 'BEGIN {
  s = t1 - t0
  printf "BENCH train_tokenizer mb=%.1f vocab=%d weft_s=%.2f hf_s=%.2f vs_hf=%.2f", \
    bytes / 1e6, vocab, s, hf_s, hf_s / s
  printf " weft_count_s=%.2f weft_merge_s=%.2f words=%d tokens=%d style=%s same_merges=%s", \
    count_s, merge_s, words, tokens, style, same
  printf " cores=%d\n", cores
}'
