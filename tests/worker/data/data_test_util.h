// Shared by the tests of worker/data: a fixture whose tests write their input files into a
// fresh temporary folder.
#ifndef WEFT_TESTS_WORKER_DATA_DATA_TEST_UTIL_H_
#define WEFT_TESTS_WORKER_DATA_DATA_TEST_UTIL_H_

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft::data::testing {

class TempFilesTest : public ::testing::Test {
 protected:
  // Writes `contents` to the file `name` of the folder; returns its path.
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_.File(name);
    weft::testing::WriteFile(path, contents);
    return path;
  }

  weft::testing::TempDir dir_;
};

}  // namespace weft::data::testing

#endif  // WEFT_TESTS_WORKER_DATA_DATA_TEST_UTIL_H_
