// Which files a DataSpec path names: one file, a directory's regular files, or a glob's matches.
#ifndef WEFT_WORKER_DATA_TOKEN_FILES_H_
#define WEFT_WORKER_DATA_TOKEN_FILES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace weft::data {

// The token files `path` names, in the order they are read as one stream:
//  - an existing file (anything that is not a directory): that file alone, unchecked (the
//    dataset's open names what is wrong with it);
//  - a directory: its regular files (links to regular files included; subdirectories and other
//    entries skipped), sorted by name as bytes, so the order does not depend on the locale;
//  - otherwise, a path holding '*', '?' or '[': a glob(3) pattern, its matches sorted the same
//    way.
// `field` names the spec field for messages ("data.train_path").
// Errors: NOT_FOUND for a path that does not exist, or a glob that matches nothing;
// FAILED_PRECONDITION for a directory without regular files, or one holding manifest.json
// (a prepared dataset: data.manifest_path is the field for it), or an unreadable directory.
absl::StatusOr<std::vector<std::string>> ListTokenFiles(const std::string& path,
                                                        const std::string& field);

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_TOKEN_FILES_H_
