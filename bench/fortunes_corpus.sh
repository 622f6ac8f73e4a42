# shellcheck shell=bash
# The text corpus of the data benches (data_prepare_bench.sh, tokenize_bench.sh), sourced:
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
