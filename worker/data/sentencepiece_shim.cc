// libweft_sentencepiece.so: Debian's libsentencepiece behind the std-only interface of
// sentencepiece_shim.h. Built without Abseil or protobuf on purpose (see the header).
#include "worker/data/sentencepiece_shim.h"

#include <unordered_map>

#include "sentencepiece_processor.h"
#include "sentencepiece_trainer.h"

namespace weft::data::spm {
namespace {

Result ToResult(const sentencepiece::util::Status& status) {
  if (status.ok()) return {};
  return Result{static_cast<int>(status.code()), status.error_message()};
}

class ProcessorImpl final : public Processor {
 public:
  int piece_size() const override { return sp_.GetPieceSize(); }
  int bos_id() const override { return sp_.bos_id(); }
  int eos_id() const override { return sp_.eos_id(); }
  int unk_id() const override { return sp_.unk_id(); }
  int pad_id() const override { return sp_.pad_id(); }
  std::vector<Piece> Pieces() const override {
    std::vector<Piece> pieces(sp_.GetPieceSize());
    for (int id = 0; id < static_cast<int>(pieces.size()); ++id) {
      Piece& p = pieces[id];
      p.text = sp_.IdToPiece(id);
      p.score = sp_.GetScore(id);
      p.kind = sp_.IsUnknown(id)   ? Piece::kUnknown
               : sp_.IsControl(id) ? Piece::kControl
               : sp_.IsUnused(id)  ? Piece::kUnused
               : sp_.IsByte(id)    ? Piece::kByte
                                   : Piece::kNormal;
    }
    return pieces;
  }
  Result Encode(std::string_view text, std::vector<int>* ids) const override {
    return ToResult(sp_.Encode(text, ids));
  }
  Result Decode(const std::vector<int>& ids, std::string* text) const override {
    return ToResult(sp_.Decode(ids, text));
  }

  sentencepiece::SentencePieceProcessor sp_;
};

// Feeds the trainer the non-empty lines of the documents, one sentence each.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& documents) : documents_(documents) {
    Advance();
  }

  bool done() const override { return doc_ >= documents_.size(); }
  void Next() override { Advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void Advance() {
    while (doc_ < documents_.size()) {
      const std::string& doc = documents_[doc_];
      if (pos_ >= doc.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      size_t end = doc.find('\n', pos_);
      if (end == std::string::npos) end = doc.size();
      line_.assign(doc, pos_, end - pos_);
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
  }

  const std::vector<std::string>& documents_;
  size_t doc_ = 0;
  size_t pos_ = 0;
  std::string line_;
};

class ApiImpl final : public Api {
 public:
  Result Load(std::string_view serialized, std::unique_ptr<Processor>* out) const override {
    auto processor = std::make_unique<ProcessorImpl>();
    Result result = ToResult(processor->sp_.LoadFromSerializedProto(serialized));
    if (result.code == 0) *out = std::move(processor);
    return result;
  }

  Result Train(const std::vector<std::pair<std::string, std::string>>& args,
               const std::vector<std::string>& documents, uint32_t seed,
               std::string* model) const override {
    const std::unordered_map<std::string, std::string> kwargs(args.begin(), args.end());
    sentencepiece::SetRandomGeneratorSeed(seed);
    LineIterator lines(documents);
    return ToResult(sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, model));
  }
};

}  // namespace
}  // namespace weft::data::spm

extern "C" __attribute__((visibility("default"))) const weft::data::spm::Api*
weft_sentencepiece_api_v2() {
  static const weft::data::spm::ApiImpl api;
  return &api;
}
