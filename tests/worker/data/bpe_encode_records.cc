// bpe_encode_records TOKENIZER CORPUS: the ids Weft's tokenizer gives each record of CORPUS
// (records separated by the byte 0x1E, as tests/fixtures/tokenizers/corpus.txt has them), one
// JSON array a line, no BOS or EOS. tests/fixtures/tokenizers/check_trained.py sets them
// against the `tokenizers` library's ids for a tokenizer.json that Weft trained.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: bpe_encode_records TOKENIZER CORPUS\n";
    return 2;
  }
  auto tokenizer = weft::data::LoadTokenizerFile(argv[1]);
  if (!tokenizer.ok()) {
    std::cerr << "bpe_encode_records: " << tokenizer.status() << "\n";
    return 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::cerr << "bpe_encode_records: cannot read " << argv[2] << "\n";
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  for (absl::string_view record : absl::StrSplit(text.str(), '\x1e')) {
    auto ids = (*tokenizer)->Encode(record);
    if (!ids.ok()) {
      std::cerr << "bpe_encode_records: " << ids.status() << "\n";
      return 1;
    }
    std::cout << "[" << absl::StrJoin(*ids, ", ") << "]\n";
  }
  return 0;
}
