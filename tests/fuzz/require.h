// The fuzzers' invariant check.
#ifndef WEFT_TESTS_FUZZ_REQUIRE_H_
#define WEFT_TESTS_FUZZ_REQUIRE_H_

#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdio>
#include <cstdlib>

namespace weft::fuzz {

// Aborts so that libFuzzer keeps the input; a plain assert would vanish under NDEBUG.
// scripts/fuzz.sh finds the report by its "invariant broken" line.
inline void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: invariant broken: %s\n", program_invocation_short_name, what);
    std::abort();
  }
}

}  // namespace weft::fuzz

#endif  // WEFT_TESTS_FUZZ_REQUIRE_H_
