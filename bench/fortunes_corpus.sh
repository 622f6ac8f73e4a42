# shellcheck shell=bash
# What the data benches (data_prepare_bench.sh, tokenize_bench.sh, train_tokenizer_bench.sh)
# share, sourced. Their text corpus:
#   fortunes_corpus NAME DIR MB
# writes DIR/once.txt (the fortune files of Debian's `fortunes`: the non-.dat, non-.u8 files
# under /usr/share/games/fortunes, concatenated; documents are cut at "%" lines) and
# DIR/corpus.txt (once.txt repeated to at least MB MB), or says what is missing, naming the
# bench NAME, and returns 2.
fortunes_corpus() {
  local name=$1 dir=$2 mb=$3 sources
  mapfile -t sources < <(find /usr/share/games/fortunes -maxdepth 1 -type f \
    ! -name '*.dat' ! -name '*.u8' | sort)
  ((${#sources[@]})) || {
    echo "$name: no fortunes under /usr/share/games/fortunes (apt-get install fortunes)" >&2
    return 2
  }
  cat "${sources[@]}" >"$dir/once.txt"
  : >"$dir/corpus.txt"
  while (($(stat -c %s "$dir/corpus.txt") < mb * 1000000)); do
    cat "$dir/once.txt" >>"$dir/corpus.txt"
  done
}

# The Hugging Face `tokenizers` wheel the tokenizer benches compare against, in a venv of its own:
#   tokenizers_venv NAME DIR
# makes DIR/venv with tokenizers==$WEFT_BENCH_TOKENIZERS_VERSION (default 0.23.3), or says
# what pip said, naming the bench NAME, and returns 2.
tokenizers_venv() {
  local name=$1 dir=$2
  python3 -m venv "$dir/venv" >/dev/null
  "$dir/venv/bin/pip" install -q "tokenizers==${WEFT_BENCH_TOKENIZERS_VERSION:-0.23.3}" \
    >"$dir/pip.log" 2>&1 || {
    echo "$name: cannot install the tokenizers wheel (pip says: $(tail -1 "$dir/pip.log"))" >&2
    return 2
  }
}
