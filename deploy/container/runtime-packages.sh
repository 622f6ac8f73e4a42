#!/bin/bash
# Prints the Debian packages that own the shared libraries the given binaries load, one per
# line: what a runtime image must install so that they start. Run in the build stage of
# Dockerfile and Dockerfile.cuda, so the runtime stage follows the build when a dependency
# is added instead of keeping a list by hand.
#   deploy/container/runtime-packages.sh BINARY...
set -euo pipefail
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    # ldd may name a path through a symlink dpkg does not know (the /lib merge, an
    # alternatives link such as OpenBLAS's): try the path, then its target.
    owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null) ||
      { echo "runtime-packages.sh: no Debian package owns $lib" >&2; exit 1; }
    echo "${owner%%:*}"
  done | sort -u
