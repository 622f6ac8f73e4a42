// Writes the seed corpus of checkpoint_chunk_fuzzer: valid stored chunks (through the real
// EncodeChunkValue, so the seeds follow the format if it changes) for each dtype's element
// size, in the fuzzer's input layout (element-size byte, then the value).
//   checkpoint_chunk_seeds OUT_DIR
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "checkpointd/chunk_codec.h"
#include "common/crc32c.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  struct Seed {
    const char* name;
    int element_size;
    std::string data;
  };
  std::string floats;  // 1.0f, -2.5f, 0.0f, 3.0e38f as a real F32 chunk would hold them
  for (uint32_t bits : {0x3F800000u, 0xC0200000u, 0x00000000u, 0x7F61B1E6u}) {
    floats.append(reinterpret_cast<const char*>(&bits), sizeof(bits));
  }
  const std::vector<Seed> seeds = {
      {"f32-4", 4, floats},
      {"bf16-3", 2, std::string("\x80\x3f\x20\xc0\x00\x00", 6)},
      {"u8-text", 1, "fortune cookie"},
      {"empty", 4, ""},
  };
  for (const Seed& s : seeds) {
    const std::string value = weft::checkpointd::EncodeChunkValue(
        s.data, weft::Crc32c(s.data.data(), s.data.size()));
    std::ofstream out(std::string(argv[1]) + "/" + s.name, std::ios::binary);
    out.put(static_cast<char>(s.element_size));
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s/%s\n", argv[1], s.name);
      return 1;
    }
  }
  return 0;
}
