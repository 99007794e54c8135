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
mapfile -t cxx < <(git ls-files '*.cc' '*.h' '*.cu')
if ! clang-format --dry-run --Werror "${cxx[@]}"; then
  echo "lint: the files above are off .clang-format (make format fixes them)"
  status=1
fi

# clang-tidy on every translation unit of the library, the tools, the Python
# module and the examples that this build compiles (the MPI backend where it is built); not
# the CUDA sources, which clang-tidy 14 cannot parse with nvcc's flags (they
# are formatted, and built with nvcc's warnings as errors).
# Findings already in scripts/lint_baseline.txt (counted per file and check,
# so that moving lines does not matter) pass; a new one fails, and so does a
# baseline entry that no longer occurs as often, so that the list only
# shrinks.
mapfile -t units < <(python3 - "$build/compile_commands.json" <<'PY'
import json, os, sys
root = os.getcwd() + "/"
for entry in json.load(open(sys.argv[1])):
    path = os.path.relpath(os.path.join(entry["directory"], entry["file"]), root)
    if path.split("/")[0] in ("src", "tools", "examples", "python") and not path.endswith(".cu"):
        print(path)
PY
)
if ((${#units[@]} == 0)); then
  echo "lint: no translation units in $build/compile_commands.json"
  exit 1
fi
findings=$(mktemp)
trap 'rm -f "$findings"' EXIT
# clang-tidy exits 1 on any finding (WarningsAsErrors), baseline ones
# included, which the check below sorts out; a unit it could not finish (a
# crash, a signal) would leave no findings at all, so any other status is a
# failure of its own.
# shellcheck disable=SC2016
printf '%s\n' "${units[@]}" | sort -u | xargs -P "$jobs" -n 1 bash -c '
  clang-tidy -p "$1" --quiet "$2" 2>/dev/null
  rc=$?
  if ((rc > 1)); then echo "lint: clang-tidy did not finish $2 (exit status $rc)"; fi
  exit 0' lint "$build" >"$findings" || true
if grep -h "^lint: clang-tidy did not finish" "$findings"; then
  status=1
fi
if ! python3 - "$findings" scripts/lint_baseline.txt "$PWD/" <<'PY'; then
import collections, re, sys
findings, baseline_path, root = sys.argv[1:]
pattern = re.compile(r"^(.*?):(\d+):(\d+): (?:warning|error): (.*) \[([^\],]+)[^\]]*\]$")
seen = {}
for line in open(findings, errors="replace"):
    m = pattern.match(line.rstrip("\n"))
    if m:
        path = m.group(1).removeprefix(root)
        seen[(path, m.group(2), m.group(3), m.group(5))] = m.group(4)
now = collections.Counter(f"{path}: {check}" for path, _, _, check in seen)
known = collections.Counter()
for line in open(baseline_path):
    line = line.strip()
    if line and not line.startswith("#"):
        count, key = line.split(" ", 1)
        known[key] = int(count)
status = 0
for (path, row, col, check), text in sorted(seen.items()):
    key = f"{path}: {check}"
    if now[key] > known[key]:
        print(f"lint: new: {path}:{row}:{col}: {text} [{check}]")
        status = 1
for key, count in sorted(known.items()):
    if now[key] < count:
        print(f"lint: {key}: found {now[key]} times, the baseline says {count}: lower it in scripts/lint_baseline.txt")
        status = 1
print(f"lint: clang-tidy: {len(seen)} findings, {sum(known.values())} of them known in the baseline")
sys.exit(status)
PY
  status=1
fi
((status == 0)) && echo "lint: ${#cxx[@]} files formatted, ${#units[@]} translation units no worse under clang-tidy"
exit $status
