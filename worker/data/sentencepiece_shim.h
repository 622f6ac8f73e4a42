// The boundary between Weft and Debian's libsentencepiece, which tokenizer.cc loads at run
// time from libweft_sentencepiece.so (sentencepiece_shim.cc) rather than linking it.
//
// Why: Debian builds libsentencepiece with its own copy of protobuf 3.14 and exports those
// symbols. In a process that also loads the system libprotobuf (every Weft program: gRPC), the
// dynamic linker binds SentencePiece's protobuf calls to the system library, whose version
// check aborts the process at load. The shim is opened with RTLD_DEEPBIND, so it and
// libsentencepiece resolve their symbols among themselves first and each protobuf stays with
// its users. Only standard-library types cross this boundary (libstdc++ is shared by both
// sides), no Abseil (SentencePiece's headers redefine absl::string_view) and no protobuf.
#ifndef WEFT_WORKER_DATA_SENTENCEPIECE_SHIM_H_
#define WEFT_WORKER_DATA_SENTENCEPIECE_SHIM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::data::spm {

// The library's file name, and its one exported symbol: a function returning the Api.
inline constexpr char kShimFileName[] = "libweft_sentencepiece.so";
inline constexpr char kShimEntryPoint[] = "weft_sentencepiece_api_v2";

// code is an absl::StatusCode number (SentencePiece uses the same numbering); 0 is OK.
struct Result {
  int code = 0;
  std::string message;
};

// One piece of a model's vocabulary as the library reports it.
struct Piece {
  enum Kind { kNormal = 0, kUnknown, kControl, kUnused, kByte };
  std::string text;
  float score = 0;
  Kind kind = kNormal;  // user-defined pieces read as kNormal: the library does not tell them
};

// One loaded model. Const methods may be called from any number of threads at once.
class Processor {
 public:
  virtual ~Processor() = default;
  virtual int piece_size() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int unk_id() const = 0;
  virtual int pad_id() const = 0;  // -1: none
  // Every piece, by id.
  virtual std::vector<Piece> Pieces() const = 0;
  virtual Result Encode(std::string_view text, std::vector<int>* ids) const = 0;
  // Every id must be in [0, piece_size()).
  virtual Result Decode(const std::vector<int>& ids, std::string* text) const = 0;
};

class Api {
 public:
  virtual Result Load(std::string_view serialized, std::unique_ptr<Processor>* out) const = 0;
  // Trains on the non-empty lines of `documents` (one sentence each) with SentencePiece's
  // `args` (its flag names and values), setting the library's random seed first.
  virtual Result Train(const std::vector<std::pair<std::string, std::string>>& args,
                       const std::vector<std::string>& documents, uint32_t seed,
                       std::string* model) const = 0;

 protected:
  ~Api() = default;
};

using ApiFunction = const Api* (*)();

}  // namespace weft::data::spm

#endif  // WEFT_WORKER_DATA_SENTENCEPIECE_SHIM_H_
