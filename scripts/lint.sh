#!/usr/bin/env bash
# Fails on C++ that is off the project's format (.clang-format) or that
# clang-tidy flags (.clang-tidy: bug patterns, performance traps, functions
# over 80 lines without a NOLINT comment saying why).
#
#   scripts/lint.sh BUILD_DIR   BUILD_DIR: a configured build with
#                               compile_commands.json (make lint uses
#                               build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/lint.sh BUILD_DIR}
jobs=${JOBS:-$(nproc)}

status=0
mapfile -t cxx < <(git ls-files '*.cc' '*.h')
if ! clang-format --dry-run --Werror "${cxx[@]}"; then
  echo "lint: the files above are off .clang-format (make format fixes them)"
  status=1
fi

# clang-tidy on every translation unit of the library, the tools and the
# examples that this build compiles (the MPI backend where it is built).
mapfile -t units < <(python3 - "$build/compile_commands.json" <<'PY'
import json, os, sys
root = os.getcwd() + "/"
for entry in json.load(open(sys.argv[1])):
    path = os.path.relpath(os.path.join(entry["directory"], entry["file"]), root)
    if path.split("/")[0] in ("src", "tools", "examples"):
        print(path)
PY
)
if ((${#units[@]} == 0)); then
  echo "lint: no translation units in $build/compile_commands.json"
  exit 1
fi
if ! printf '%s\n' "${units[@]}" | sort -u |
    xargs -P "$jobs" -n 1 clang-tidy -p "$build" --quiet 2> >(grep -v "warnings generated" >&2); then
  echo "lint: clang-tidy found the problems above"
  status=1
fi
((status == 0)) && echo "lint: ${#cxx[@]} files formatted, ${#units[@]} translation units clean under clang-tidy"
exit $status
