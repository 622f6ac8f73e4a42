#include "trainctl/data_prepare.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "trainctl/data_inputs.h"
#include "common/status.h"
#include "common/status_context.h"
#include "nlohmann/json.hpp"
#include "worker/data/chat_template.h"
#include "worker/data/manifest.h"
#include "worker/data/random.h"
#include "worker/data/token_flags.h"
#include "worker/data/tokenizer.h"

namespace weft::dataprep {
namespace {

namespace fs = std::filesystem;

using data::ManifestShard;
using data::Tokenizer;

constexpr size_t kWriteBufferBytes = size_t{1} << 20;
constexpr int kHeaderInts = 256;

// ---------------------------------------------------------------------------------------
// Work items. A chunk is a run of consecutive documents; chunks are numbered in input order
// and written in that order whatever thread encoded them.

struct Document {
  int64_t index = 0;   // among all documents of all inputs: the validation split's hash key
  int32_t source = 0;  // into the source list
  int64_t line = 1;
  absl::string_view raw;  // text, or the JSON line of a .jsonl file
};

struct Chunk {
  int64_t seq = 0;
  std::vector<Document> documents;
  std::vector<std::shared_ptr<const MappedFile>> files;  // keep `raw` views alive
  int64_t input_bytes = 0;
  absl::Status status;  // a reading error, reported when the writer reaches this chunk
};

struct EncodedDocument {
  int64_t begin = 0;  // into EncodedChunk::tokens
  int64_t size = 0;
  int32_t source = 0;
  bool val = false;
};

struct EncodedChunk {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> flags;  // chat data: one per token
  std::vector<EncodedDocument> documents;
  int64_t input_bytes = 0;
  absl::Status status;
};

// Chunks from the reader to the encoders, and encoded chunks back to the writer in order.
// At most `limit` chunks are between reader and writer, which bounds memory.
class ChunkPipe {
 public:
  explicit ChunkPipe(int limit) : limit_(limit) {}

  // Reader: false once the writer gave up.
  bool Push(Chunk chunk) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ChunkPipe* p) { return p->cancelled_ || p->in_flight_ < p->limit_; }, this));
    if (cancelled_) return false;
    ++in_flight_;
    todo_.push_back(std::move(chunk));
    return true;
  }
  void CloseInput(int64_t chunks) {
    absl::MutexLock lock(&mu_);
    total_chunks_ = chunks;
  }

  // Encoders: the next chunk to encode, or nullopt when there is none left.
  std::optional<Chunk> Take() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ChunkPipe* p) { return p->cancelled_ || !p->todo_.empty() || p->total_chunks_ >= 0; },
        this));
    if (cancelled_ || todo_.empty()) return std::nullopt;
    Chunk chunk = std::move(todo_.front());
    todo_.pop_front();
    return chunk;
  }
  void Done(int64_t seq, EncodedChunk encoded) {
    absl::MutexLock lock(&mu_);
    done_.emplace(seq, std::move(encoded));
  }

  // Writer: chunk `next_` once encoded, or nullopt after the last one.
  std::optional<EncodedChunk> Next() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ChunkPipe* p) {
          return p->done_.count(p->next_) > 0 || p->next_ == p->total_chunks_;
        },
        this));
    if (next_ == total_chunks_) return std::nullopt;
    auto it = done_.find(next_);
    EncodedChunk encoded = std::move(it->second);
    done_.erase(it);
    ++next_;
    --in_flight_;
    return encoded;
  }
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

 private:
  absl::Mutex mu_;
  const int limit_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Chunk> todo_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, EncodedChunk> done_ ABSL_GUARDED_BY(mu_);
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_chunks_ ABSL_GUARDED_BY(mu_) = -1;  // known once the reader is done
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------------------
// Output.

absl::Status ErrnoError(const std::string& what) {
  return absl::ErrnoToStatus(errno, what);
}

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(absl::StrCat(path, ": write failed"));
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteWholeFile(const std::string& path, const std::string& contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(absl::StrCat(path, ": cannot create"));
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  WEFT_RETURN_IF_ERROR(WriteAll(fd, contents.data(), contents.size(), path));
  if (::fdatasync(fd) != 0) return ErrnoError(absl::StrCat(path, ": fdatasync failed"));
  return absl::OkStatus();
}

// One split's token stream, cut into llm.c token files `<prefix>-NNNNN.bin` in `dir`, and
// with flags into token flags files `<prefix>-NNNNN.flags` beside them, token for token.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string prefix, weft::v1::DataFormat format,
              int64_t shard_tokens, bool with_flags)
      : dir_(std::move(dir)),
        prefix_(std::move(prefix)),
        format_(format),
        width_(format == weft::v1::DATA_FORMAT_UINT32_BIN ? 4 : 2),
        shard_tokens_(shard_tokens),
        with_flags_(with_flags) {}
  ~ShardWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (flags_fd_ >= 0) ::close(flags_fd_);
  }

  // Appends a document, after `separator` if this is not the split's first (-1: none). A
  // writer with flags takes one per token and no separator: its documents' starts are flagged.
  absl::Status AddDocument(absl::Span<const int32_t> tokens, absl::Span<const uint8_t> flags,
                           int32_t separator) {
    if (documents_ > 0 && separator >= 0 && !with_flags_) {
      WEFT_RETURN_IF_ERROR(Put(&separator, nullptr, 1));
    }
    ++documents_;
    return Put(tokens.data(), with_flags_ ? flags.data() : nullptr, tokens.size());
  }

  absl::StatusOr<std::vector<ManifestShard>> Finish() {
    if (fd_ >= 0) WEFT_RETURN_IF_ERROR(CloseShard());
    return shards_;
  }

  int64_t tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }
  int64_t target_tokens() const { return target_tokens_; }

 private:
  absl::Status Put(const int32_t* tokens, const uint8_t* flags, size_t n) {
    while (n > 0) {
      if (fd_ < 0) WEFT_RETURN_IF_ERROR(OpenShard());
      const size_t take = std::min<size_t>(n, static_cast<size_t>(shard_tokens_ - in_shard_));
      for (size_t i = 0; i < take; ++i) {
        // Little-endian, as the llm.c format and every machine Weft runs on.
        const uint32_t t = static_cast<uint32_t>(tokens[i]);
        buffer_.append(reinterpret_cast<const char*>(&t), width_);
      }
      if (flags != nullptr) {
        flags_buffer_.append(reinterpret_cast<const char*>(flags), take);
        for (size_t i = 0; i < take; ++i) target_tokens_ += (flags[i] & data::kTokenFlagLoss) != 0;
        flags += take;
      }
      tokens += take;
      n -= take;
      in_shard_ += static_cast<int64_t>(take);
      tokens_ += static_cast<int64_t>(take);
      if (buffer_.size() >= kWriteBufferBytes) WEFT_RETURN_IF_ERROR(Flush());
      if (in_shard_ == shard_tokens_) WEFT_RETURN_IF_ERROR(CloseShard());
    }
    return absl::OkStatus();
  }

  absl::Status OpenShard() {
    file_ = absl::StrFormat("%s-%05d.bin", prefix_, shards_.size());
    path_ = absl::StrCat(dir_, "/", file_);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoError(absl::StrCat(path_, ": cannot create"));
    in_shard_ = 0;
    // The header's count is known at the end; its place is kept now.
    buffer_.assign(kHeaderInts * sizeof(int32_t), '\0');
    if (with_flags_) {
      flags_file_ = absl::StrFormat("%s-%05d.flags", prefix_, shards_.size());
      flags_path_ = absl::StrCat(dir_, "/", flags_file_);
      flags_fd_ = ::open(flags_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (flags_fd_ < 0) return ErrnoError(absl::StrCat(flags_path_, ": cannot create"));
      flags_buffer_.assign(data::kTokenFlagsHeaderBytes, '\0');
    }
    return absl::OkStatus();
  }

  absl::Status Flush() {
    WEFT_RETURN_IF_ERROR(WriteAll(fd_, buffer_.data(), buffer_.size(), path_));
    buffer_.clear();
    if (flags_fd_ >= 0) {
      WEFT_RETURN_IF_ERROR(
          WriteAll(flags_fd_, flags_buffer_.data(), flags_buffer_.size(), flags_path_));
      flags_buffer_.clear();
    }
    return absl::OkStatus();
  }

  absl::Status CloseShard() {
    WEFT_RETURN_IF_ERROR(Flush());
    int32_t header[kHeaderInts] = {};
    const bool wide = format_ == weft::v1::DATA_FORMAT_UINT32_BIN;
    header[0] = wide ? 20240801 : 20240520;
    header[1] = wide ? 7 : 1;
    header[2] = static_cast<int32_t>(in_shard_);
    if (::pwrite(fd_, header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
      return ErrnoError(absl::StrCat(path_, ": header write failed"));
    }
    if (::fdatasync(fd_) != 0) return ErrnoError(absl::StrCat(path_, ": fdatasync failed"));
    ::close(fd_);
    fd_ = -1;
    // Read back from the page cache: the header precedes the tokens but is known last.
    WEFT_ASSIGN_OR_RETURN(uint32_t crc, data::Crc32cOfFile(path_));
    ManifestShard shard{file_, in_shard_,
                        static_cast<int64_t>(sizeof(header)) + in_shard_ * width_, crc};
    if (flags_fd_ >= 0) {
      const std::string flags_header = data::TokenFlagsHeader(static_cast<int32_t>(in_shard_));
      if (::pwrite(flags_fd_, flags_header.data(), flags_header.size(), 0) !=
          static_cast<ssize_t>(flags_header.size())) {
        return ErrnoError(absl::StrCat(flags_path_, ": header write failed"));
      }
      if (::fdatasync(flags_fd_) != 0) {
        return ErrnoError(absl::StrCat(flags_path_, ": fdatasync failed"));
      }
      ::close(flags_fd_);
      flags_fd_ = -1;
      shard.flags_file = flags_file_;
      shard.flags_bytes = data::kTokenFlagsHeaderBytes + in_shard_;
      WEFT_ASSIGN_OR_RETURN(shard.flags_crc32c, data::Crc32cOfFile(flags_path_));
    }
    shards_.push_back(std::move(shard));
    return absl::OkStatus();
  }

  const std::string dir_;
  const std::string prefix_;
  const weft::v1::DataFormat format_;
  const int width_;
  const int64_t shard_tokens_;
  const bool with_flags_;
  int fd_ = -1;
  std::string file_;
  std::string path_;
  std::string buffer_;
  int flags_fd_ = -1;
  std::string flags_file_;
  std::string flags_path_;
  std::string flags_buffer_;
  int64_t in_shard_ = 0;
  int64_t tokens_ = 0;
  int64_t documents_ = 0;
  int64_t target_tokens_ = 0;
  std::vector<ManifestShard> shards_;
};

// ---------------------------------------------------------------------------------------
// Progress on stderr.

std::string FormatSeconds(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrCat(s, "s");
}

class ProgressReporter {
 public:
  ProgressReporter(Progress mode, FILE* out, int64_t total_bytes)
      : mode_(mode), out_(out), total_(std::max<int64_t>(1, total_bytes)), start_(absl::Now()) {}

  void Update(int64_t bytes, int64_t tokens) {
    if (mode_ == Progress::kNone) return;
    const absl::Time now = absl::Now();
    const absl::Duration every =
        mode_ == Progress::kBar ? absl::Milliseconds(100) : absl::Seconds(5);
    if (now - last_ < every) return;
    last_ = now;
    Print(bytes, tokens, now);
  }

  void Finish(int64_t bytes, int64_t tokens) {
    if (mode_ == Progress::kNone) return;
    Print(bytes, tokens, absl::Now());
    if (mode_ == Progress::kBar) std::fputc('\n', out_);
    std::fflush(out_);
  }

 private:
  void Print(int64_t bytes, int64_t tokens, absl::Time now) {
    const double elapsed = std::max(1e-6, absl::ToDoubleSeconds(now - start_));
    const double mb_per_s = bytes / elapsed / 1e6;
    const double fraction = std::min(1.0, static_cast<double>(bytes) / total_);
    const std::string eta =
        bytes > 0 ? FormatSeconds(elapsed * (total_ - bytes) / bytes) : std::string("-");
    const std::string stats =
        absl::StrFormat("%3.0f%%  %.1f/%.1f MB  %.1f MB/s  %d tokens  ETA %s", fraction * 100,
                        bytes / 1e6, total_ / 1e6, mb_per_s, tokens, eta);
    if (mode_ == Progress::kBar) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(fraction * kWidth);
      std::fprintf(out_, "\r[%s%s] %s\033[K", std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), stats.c_str());
    } else {
      std::fprintf(out_, "prepare: %s\n", stats.c_str());
    }
    std::fflush(out_);
  }

  const Progress mode_;
  FILE* const out_;
  const int64_t total_;
  const absl::Time start_;
  absl::Time last_ = absl::InfinitePast();
};

// ---------------------------------------------------------------------------------------
// The run.

struct Plan {
  PrepareOptions options;
  std::vector<SourceFile> sources;
  std::unique_ptr<Tokenizer> tokenizer;
  weft::v1::DataFormat token_format = weft::v1::DATA_FORMAT_UNSPECIFIED;
  nlohmann::ordered_json options_json;
  // Chat data: the template with the tokenizer's ids of its special tokens.
  std::optional<data::ChatTokenizer> chat;
  data::LossMask loss_mask = data::LossMask::kAssistant;
};

// Reads every input into chunks; runs on its own thread.
void ReadChunks(const Plan& plan, ChunkPipe* pipe) {
  Chunk chunk;
  int64_t seq = 0;
  int64_t index = 0;
  const auto emit = [&] {
    chunk.seq = seq++;
    const bool ok = pipe->Push(std::move(chunk));
    chunk = Chunk();
    return ok;
  };
  for (size_t s = 0; s < plan.sources.size(); ++s) {
    const SourceFile& source = plan.sources[s];
    absl::StatusOr<std::shared_ptr<const MappedFile>> file = MappedFile::Open(source.path);
    if (!file.ok()) {
      chunk.status = file.status();
      emit();
      break;
    }
    chunk.files.push_back(*file);
    absl::Status read = ForEachRawDocument(
        (*file)->data(), source.jsonl, plan.options.doc_separator,
        [&](const RawDocument& raw) -> absl::Status {
          chunk.documents.push_back(
              Document{index++, static_cast<int32_t>(s), raw.line, raw.text});
          chunk.input_bytes += static_cast<int64_t>(raw.text.size());
          if (chunk.input_bytes < plan.options.chunk_bytes) return absl::OkStatus();
          if (!emit()) return absl::CancelledError();
          chunk.files.push_back(*file);
          return absl::OkStatus();
        });
    if (!read.ok()) break;  // only a cancelled push stops the reading
  }
  if (!chunk.documents.empty() || !chunk.status.ok()) emit();
  pipe->CloseInput(seq);
}

EncodedChunk EncodeChunk(const Plan& plan, const Chunk& chunk, uint64_t split_key) {
  EncodedChunk out;
  out.input_bytes = chunk.input_bytes;
  out.status = chunk.status;
  const bool check_utf8 = plan.tokenizer->kind() != "bytes";
  for (const Document& doc : chunk.documents) {
    if (!out.status.ok()) break;
    const SourceFile& source = plan.sources[doc.source];
    const uint64_t h = data::HashCombine(split_key, static_cast<uint64_t>(doc.index));
    const bool val = static_cast<double>(h >> 11) * 0x1.0p-53 < plan.options.val_fraction;
    if (plan.chat) {
      absl::StatusOr<std::vector<data::ChatMessage>> messages =
          JsonlConversation(doc.raw, source.path, doc.line);
      if (!messages.ok()) {
        out.status = messages.status();
        break;
      }
      absl::StatusOr<data::TokenizedChat> chat = plan.chat->Tokenize(*messages, plan.loss_mask);
      if (!chat.ok()) {
        out.status = Annotate(chat.status(), absl::StrCat(source.path, ":", doc.line));
        break;
      }
      out.documents.push_back(EncodedDocument{static_cast<int64_t>(out.tokens.size()),
                                              static_cast<int64_t>(chat->ids.size()),
                                              doc.source, val});
      out.tokens.insert(out.tokens.end(), chat->ids.begin(), chat->ids.end());
      out.flags.insert(out.flags.end(), chat->flags.begin(), chat->flags.end());
      continue;
    }
    absl::string_view text = doc.raw;
    std::string owned;
    if (source.jsonl) {
      absl::StatusOr<std::string> field =
          JsonlDocument(doc.raw, plan.options.jsonl_field, source.path, doc.line);
      if (!field.ok()) {
        out.status = field.status();
        break;
      }
      owned = std::move(*field);
      text = owned;
    } else if (check_utf8) {
      out.status = CheckUtf8(text, source.path, doc.line);
      if (!out.status.ok()) break;
    }
    if (text.empty()) continue;
    EncodedDocument encoded;
    encoded.begin = static_cast<int64_t>(out.tokens.size());
    encoded.source = doc.source;
    encoded.val = val;
    out.status = plan.tokenizer->EncodeTo(text, &out.tokens);
    if (!out.status.ok()) {
      out.status = Annotate(out.status, absl::StrCat(source.path, ":", doc.line));
      break;
    }
    encoded.size = static_cast<int64_t>(out.tokens.size()) - encoded.begin;
    out.documents.push_back(encoded);
  }
  return out;
}

struct Written {
  std::vector<ManifestShard> train;
  std::vector<ManifestShard> val;
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  int64_t train_target_tokens = 0;
  int64_t val_target_tokens = 0;
  std::vector<int64_t> source_documents;
  int64_t input_bytes = 0;
};

// Writes the encoded chunks in order into `dir`.
absl::StatusOr<Written> WriteChunks(const Plan& plan, const std::string& dir, ChunkPipe* pipe) {
  const bool chat = plan.chat.has_value();
  ShardWriter train(dir, "train", plan.token_format, plan.options.shard_tokens, chat);
  ShardWriter val(dir, "val", plan.token_format, plan.options.shard_tokens, chat);
  Written written;
  written.source_documents.assign(plan.sources.size(), 0);
  int64_t total_bytes = 0;
  for (const SourceFile& s : plan.sources) total_bytes += s.bytes;
  ProgressReporter progress(plan.options.progress, plan.options.progress_out, total_bytes);
  // Conversations need no separator: their first tokens are flagged.
  const int32_t separator = chat ? -1 : plan.tokenizer->eos_id();
  while (std::optional<EncodedChunk> chunk = pipe->Next()) {
    WEFT_RETURN_IF_ERROR(chunk->status);
    for (const EncodedDocument& doc : chunk->documents) {
      ShardWriter& split = doc.val ? val : train;
      const absl::Span<const uint8_t> flags =
          chat ? absl::MakeConstSpan(chunk->flags).subspan(doc.begin, doc.size)
               : absl::Span<const uint8_t>();
      WEFT_RETURN_IF_ERROR(split.AddDocument(
          absl::MakeConstSpan(chunk->tokens).subspan(doc.begin, doc.size), flags, separator));
      ++written.source_documents[doc.source];
    }
    written.input_bytes += chunk->input_bytes;
    progress.Update(written.input_bytes, train.tokens() + val.tokens());
  }
  // Separator lines and blank JSONL lines are read but not counted as text: all is read now.
  progress.Finish(total_bytes, train.tokens() + val.tokens());
  if (train.tokens() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no training tokens: ", val.documents(), " documents went to validation (val_fraction ",
        plan.options.val_fraction, ") and none to training"));
  }
  if (chat && plan.loss_mask == data::LossMask::kAssistant && train.target_tokens() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no target tokens: none of the ", train.documents(), " training conversations has an "
        "assistant message, and --loss-mask assistant trains on nothing else"));
  }
  written.train_documents = train.documents();
  written.val_documents = val.documents();
  written.train_target_tokens = train.target_tokens();
  written.val_target_tokens = val.target_tokens();
  WEFT_ASSIGN_OR_RETURN(written.train, train.Finish());
  WEFT_ASSIGN_OR_RETURN(written.val, val.Finish());
  return written;
}

// Reads, encodes (in parallel) and writes the shards into `dir`.
absl::StatusOr<Written> EncodeAll(const Plan& plan, const std::string& dir) {
  int threads = plan.options.threads;
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  ChunkPipe pipe(2 * threads + 2);
  const uint64_t split_key = data::Mix64(plan.options.seed);
  std::thread reader([&] { ReadChunks(plan, &pipe); });
  std::vector<std::thread> encoders;
  for (int i = 0; i < threads; ++i) {
    encoders.emplace_back([&] {
      while (std::optional<Chunk> chunk = pipe.Take()) {
        const int64_t seq = chunk->seq;
        pipe.Done(seq, EncodeChunk(plan, *chunk, split_key));
      }
    });
  }
  absl::StatusOr<Written> written = WriteChunks(plan, dir, &pipe);
  // Unblocks the reader and the encoders if the writer stopped early.
  pipe.Cancel();
  reader.join();
  for (std::thread& t : encoders) t.join();
  return written;
}

data::DatasetManifest MakeManifest(const Plan& plan, const Written& written) {
  data::DatasetManifest m;
  m.token_format = plan.token_format;
  const Tokenizer& tok = *plan.tokenizer;
  m.tokenizer.kind = std::string(tok.kind());
  if (tok.kind() != "bytes") {
    m.tokenizer.file = data::TokenizerFileName(tok.kind());
    m.tokenizer.crc32c = tok.fingerprint();
  }
  m.tokenizer.vocab_size = tok.vocab_size();
  m.tokenizer.bos_id = tok.bos_id();
  m.tokenizer.eos_id = tok.eos_id();
  // Chat data's documents start where their flags say, never after an EOS.
  m.document_separator = !plan.chat && tok.eos_id() >= 0 ? "eos" : "none";
  if (plan.chat) {
    m.chat_template = std::string(plan.chat->chat_template().name());
    m.loss_mask = std::string(data::LossMaskName(plan.loss_mask));
  }
  m.train = written.train;
  m.val = written.val;
  m.train_documents = written.train_documents;
  m.val_documents = written.val_documents;
  for (size_t s = 0; s < plan.sources.size(); ++s) {
    m.sources.push_back(data::ManifestSource{plan.sources[s].path, plan.sources[s].bytes,
                                             written.source_documents[s]});
  }
  m.options_json = plan.options_json.dump();
  return m;
}

// ---------------------------------------------------------------------------------------
// The output directory.

// Why `dir`'s dataset is not the one `plan` would write, or "" if it is.
std::string DifferenceFrom(const Plan& plan, const std::string& dir) {
  absl::StatusOr<data::DatasetManifest> m = data::ReadManifest(dir);
  if (!m.ok()) return absl::StrCat("no readable manifest (", m.status().message(), ")");
  if (nlohmann::ordered_json::parse(m->options_json, nullptr, false) != plan.options_json) {
    return "it was prepared with other options, inputs or tokenizer";
  }
  if (m->sources.size() != plan.sources.size()) return "its inputs differ";
  for (size_t s = 0; s < plan.sources.size(); ++s) {
    if (m->sources[s].path != plan.sources[s].path ||
        m->sources[s].bytes != plan.sources[s].bytes) {
      return absl::StrCat("input ", plan.sources[s].path, " differs");
    }
  }
  for (const auto* split : {&m->train, &m->val}) {
    for (const ManifestShard& shard : *split) {
      std::error_code error;
      const auto size = fs::file_size(data::ManifestFilePath(*m, shard.file), error);
      if (error || static_cast<int64_t>(size) != shard.bytes) {
        return absl::StrCat("its shard ", shard.file, " is missing or changed");
      }
      if (shard.flags_file.empty()) continue;
      const auto flags_size = fs::file_size(data::ManifestFilePath(*m, shard.flags_file), error);
      if (error || static_cast<int64_t>(flags_size) != shard.flags_bytes) {
        return absl::StrCat("its flags file ", shard.flags_file, " is missing or changed");
      }
    }
  }
  return "";
}

// Whether `dir` holds a manifest.json that says it is a Weft dataset. Only the format tag is
// read: an older or damaged manifest still marks the directory as prepare's own.
bool HoldsWeftManifest(const fs::path& dir) {
  std::ifstream in(dir / data::kManifestFileName);
  if (!in) return false;
  const nlohmann::json manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return manifest.is_object() && manifest.contains("format") &&
         manifest["format"] == data::kManifestFormat;
}

// OK when `force` may replace the existing `out` (DecideForcedReplace); FAILED_PRECONDITION
// naming --out and why otherwise.
absl::Status CheckForcedReplace(const Plan& plan, const std::string& out) {
  std::error_code error;
  const auto canonical = [&](const std::string& path) -> absl::StatusOr<std::string> {
    fs::path resolved = fs::canonical(path, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot resolve (", error.message(), ")"));
    }
    return resolved.string();
  };
  std::vector<std::string> inputs;
  for (const SourceFile& s : plan.sources) {
    WEFT_ASSIGN_OR_RETURN(inputs.emplace_back(), canonical(s.path));
  }
  if (!plan.options.tokenizer_path.empty()) {
    WEFT_ASSIGN_OR_RETURN(inputs.emplace_back(), canonical(plan.options.tokenizer_path));
  }
  absl::StatusOr<std::string> resolved = canonical(out);
  if (!resolved.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out ", out, ": --force refuses it: ", resolved.status().message()));
  }
  const bool is_directory = fs::is_directory(*resolved, error);
  const ForcedReplaceDecision decision = DecideForcedReplace(
      *resolved, is_directory, is_directory && HoldsWeftManifest(*resolved), inputs);
  if (decision.replace) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--out ", out, ": --force replaces only another Weft dataset, and ", decision.reason,
      "; nothing was deleted"));
}

// Removes DIR.tmp-<pid> and DIR.old-<pid> left by runs that died (their pid is gone).
void RemoveStaleTemporaries(const std::string& out_dir) {
  const fs::path out(out_dir);
  const std::string prefix = out.filename().string();
  // A relative DIR's siblings are in the working directory; "" names no directory at all.
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, prefix) ||
        !(absl::ConsumePrefix(&rest, ".tmp-") || absl::ConsumePrefix(&rest, ".old-"))) {
      continue;
    }
    int pid = 0;
    if (!absl::SimpleAtoi(rest, &pid) || pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), error);
  }
}

// Puts the finished `temp` in place of `out` (an existing `out` only when forced).
absl::Status Replace(const std::string& temp, const std::string& out) {
  std::error_code error;
  const std::string old = absl::StrCat(out, ".old-", ::getpid());
  const bool had_old = fs::exists(out, error);
  if (had_old && std::rename(out.c_str(), old.c_str()) != 0) {
    return ErrnoError(absl::StrCat(out, ": cannot move the old dataset aside"));
  }
  if (std::rename(temp.c_str(), out.c_str()) != 0) {
    const absl::Status status = ErrnoError(absl::StrCat(out, ": rename from ", temp, " failed"));
    if (had_old) std::rename(old.c_str(), out.c_str());
    return status;
  }
  if (had_old) fs::remove_all(old, error);
  const std::string parent = fs::path(out).parent_path().string();
  const int fd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const PrepareOptions& o) {
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out: required");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val-fraction ", o.val_fraction, ": must be in [0, 1)"));
  }
  if (o.shard_tokens < 1 || o.shard_tokens > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard-tokens ", o.shard_tokens, ": must be in [1, 2147483647] (the llm.c header "
        "counts tokens in an int32)"));
  }
  if (o.chunk_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes ", o.chunk_bytes, " < 1"));
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", o.threads, ": must be >= 0"));
  }
  if (o.jsonl_field.empty()) return absl::InvalidArgumentError("--jsonl-field: empty");
  if (o.doc_separator.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError("--doc-separator: one line, without a newline");
  }
  if (!o.chat_template.empty()) {
    if (!data::ParseLossMask(o.loss_mask)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--loss-mask ", o.loss_mask, ": must be \"assistant\" or \"all\""));
    }
    if (o.tokenizer_path.empty()) {
      return absl::InvalidArgumentError(
          "--chat: needs --tokenizer, a tokenizer.json with the chat template's special tokens");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> MakePlan(const PrepareOptions& options) {
  WEFT_RETURN_IF_ERROR(CheckOptions(options));
  Plan plan;
  plan.options = options;
  WEFT_ASSIGN_OR_RETURN(plan.sources, ExpandInputs(options.inputs));
  if (options.tokenizer_path.empty()) {
    plan.tokenizer = data::MakeByteTokenizer();
  } else {
    WEFT_ASSIGN_OR_RETURN(plan.tokenizer, data::LoadTokenizerFile(options.tokenizer_path));
  }
  WEFT_ASSIGN_OR_RETURN(plan.token_format, TokenFormatForVocab(plan.tokenizer->vocab_size()));
  if (!options.chat_template.empty()) {
    absl::StatusOr<data::ChatTemplate> chat_template =
        data::ChatTemplate::Named(options.chat_template);
    if (!chat_template.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--template: ", chat_template.status().message()));
    }
    for (const SourceFile& s : plan.sources) {
      if (!s.jsonl) {
        return absl::InvalidArgumentError(absl::StrCat(
            s.path, ": --chat reads conversations from JSONL files (*.jsonl), one a line"));
      }
    }
    WEFT_ASSIGN_OR_RETURN(plan.chat, data::ChatTokenizer::Create(*chat_template,
                                                                  plan.tokenizer.get(),
                                                                  options.tokenizer_path));
    plan.loss_mask = *data::ParseLossMask(options.loss_mask);
  }
  // Everything that decides the output bytes, apart from the inputs' contents (paths and
  // sizes are in "sources"; mtimes stand for contents here).
  nlohmann::ordered_json mtimes = nlohmann::ordered_json::array();
  for (const SourceFile& s : plan.sources) mtimes.push_back(s.mtime_ns);
  plan.options_json = {
      {"tokenizer", options.tokenizer_path.empty() ? "bytes" : options.tokenizer_path},
      {"tokenizer_crc32c", data::FormatCrc32c(plan.tokenizer->fingerprint())},
      {"jsonl_field", options.jsonl_field},
      {"doc_separator", options.doc_separator},
      {"val_fraction", options.val_fraction},
      {"seed", options.seed},
      {"shard_tokens", options.shard_tokens},
      {"source_mtimes_ns", mtimes},
  };
  // Only chat data records these, so that a text dataset's options stay what they were.
  if (plan.chat) {
    plan.options_json["chat_template"] = options.chat_template;
    plan.options_json["loss_mask"] = options.loss_mask;
  }
  return plan;
}

absl::Status CreateTemporary(const std::string& out, const std::string& temp) {
  std::error_code error;
  const fs::path parent = fs::path(out).parent_path();
  if (!parent.empty()) fs::create_directories(parent, error);
  if (::mkdir(temp.c_str(), 0755) != 0) {
    return ErrnoError(absl::StrCat("--out ", out, ": cannot create ", temp));
  }
  return absl::OkStatus();
}

}  // namespace

ForcedReplaceDecision DecideForcedReplace(const std::string& out, bool is_directory,
                                          bool is_dataset,
                                          const std::vector<std::string>& inputs) {
  const std::string out_prefix = out == "/" ? out : out + "/";
  for (const std::string& input : inputs) {
    if (input == out) return {false, absl::StrCat("it is the input ", input)};
    if (absl::StartsWith(input, out_prefix)) {
      return {false, absl::StrCat("it contains the input ", input)};
    }
  }
  if (!is_directory) return {false, "it is not a directory"};
  if (!is_dataset) {
    return {false, absl::StrCat("it is not one (no ", data::kManifestFileName,
                                " of format \"", data::kManifestFormat, "\")")};
  }
  return {true, ""};
}

absl::StatusOr<weft::v1::DataFormat> TokenFormatForVocab(int64_t vocab_size) {
  constexpr int64_t kMaxVocab = int64_t{1} << 24;  // model.vocab_size's bound
  if (vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary size ", vocab_size));
  }
  if (vocab_size > (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocabulary of ", vocab_size, " tokens: too large for uint32 token files"));
  }
  if (vocab_size > kMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary of ", vocab_size,
                                                   " tokens: larger than any model's "
                                                   "vocab_size (at most ",
                                                   kMaxVocab, ")"));
  }
  return vocab_size <= 65536 ? weft::v1::DATA_FORMAT_UINT16_BIN
                             : weft::v1::DATA_FORMAT_UINT32_BIN;
}

absl::StatusOr<PrepareResult> PrepareDataset(const PrepareOptions& options) {
  const absl::Time start = absl::Now();
  WEFT_ASSIGN_OR_RETURN(Plan plan, MakePlan(options));
  // "ds/" names ds: without the slash its siblings (ds.tmp-<pid>) are beside it, not inside.
  std::string out = fs::path(options.out_dir).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  PrepareResult result;
  for (const SourceFile& s : plan.sources) result.input_bytes += s.bytes;
  std::error_code error;
  if (fs::exists(out, error)) {
    const std::string difference = DifferenceFrom(plan, out);
    if (difference.empty()) {
      result.up_to_date = true;
      return result;
    }
    if (!options.force) {
      return absl::FailedPreconditionError(absl::StrCat(
          out, " exists and is not this dataset: ", difference, "; pass --force to replace it"));
    }
    WEFT_RETURN_IF_ERROR(CheckForcedReplace(plan, out));
  }
  RemoveStaleTemporaries(out);
  const std::string temp = absl::StrCat(out, ".tmp-", ::getpid());
  WEFT_RETURN_IF_ERROR(CreateTemporary(out, temp));
  absl::Cleanup remove_temp = [&] { fs::remove_all(temp, error); };

  WEFT_ASSIGN_OR_RETURN(Written written, EncodeAll(plan, temp));
  if (plan.tokenizer->kind() != "bytes") {
    WEFT_RETURN_IF_ERROR(WriteWholeFile(
        absl::StrCat(temp, "/", data::TokenizerFileName(plan.tokenizer->kind())),
                                        plan.tokenizer->model_bytes()));
  }
  WEFT_RETURN_IF_ERROR(data::WriteManifest(MakeManifest(plan, written), temp));
  WEFT_RETURN_IF_ERROR(Replace(temp, out));
  std::move(remove_temp).Cancel();

  for (const ManifestShard& s : written.train) result.train_tokens += s.tokens;
  for (const ManifestShard& s : written.val) result.val_tokens += s.tokens;
  result.train_documents = written.train_documents;
  result.val_documents = written.val_documents;
  result.train_target_tokens = written.train_target_tokens;
  result.val_target_tokens = written.val_target_tokens;
  result.train_shards = static_cast<int>(written.train.size());
  result.val_shards = static_cast<int>(written.val.size());
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace weft::dataprep
