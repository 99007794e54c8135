#!/usr/bin/env bash
# Fails when a file includes a header of a layer above its own, or reaches a
# backend other than through the seam (docs/architecture.md, "Layers").
#
#   values (core) <- communicators (comm) <- runtime <- training <- tools
#
# A layer includes its own headers and those below it. Outside src/comm/, the
# one communicator header is comm/backend.h (the factory and the rendezvous
# interface); the public distribute/communicator.h and distribute/mpi.h are
# the comm layer's public side. Tests may reach any layer they test. The
# Python module (python/src/) sits with the tools, on the public headers only.
set -euo pipefail
cd "$(dirname "$0")/.."

# The layer of each public header (include/distribute/).
public_layer() {
  case "$1" in
    dtype | errors | tensor | nest | indexed_slices | dlpack | reduce_op | options | devices) echo 0 ;;
    communicator | mpi) echo 1 ;;
    context | distributed_values | replica_context | strategy | mirrored_strategy | \
      multi_worker_mirrored_strategy | input) echo 2 ;;
    variables | optimizers | checkpoint | preemption) echo 3 ;;
    # include/distribute/internal/: what the public headers' templates need
    # and users do not call, each in the layer of the header that includes it.
    internal/tensor | internal/nest_format) echo 0 ;;
    internal/run_on_replicas | internal/access | internal/merge_types | internal/exception_text) echo 2 ;;
    internal/variable_update) echo 3 ;;
    distribute) echo 4 ;;  # the umbrella header
    *) echo unknown ;;
  esac
}

# The layer of a file of the tree, by its path.
file_layer() {
  case "$1" in
    src/core/*) echo 0 ;;
    src/comm/*) echo 1 ;;
    src/runtime/*) echo 2 ;;
    src/training/*) echo 3 ;;
    tools/* | examples/* | python/src/*) echo 4 ;;
    include/distribute/*.h)
      local name="${1#include/distribute/}"
      public_layer "${name%.h}"
      ;;
    *) echo unknown ;;
  esac
}

# Includes still against the rule, each with the issue that removes it. A
# line here that no longer matches fails too, so that the list only shrinks.
known=()

names=(core comm runtime training tools)
status=0
found=()
while IFS= read -r file; do
  layer=$(file_layer "$file")
  if [[ "$layer" == unknown ]]; then
    echo "check_layers: $file: no layer for this file (add it to scripts/check_layers.sh)"
    status=1
    continue
  fi
  while IFS= read -r header; do
    target=unknown
    case "$header" in
      core/*) target=0 ;;
      comm/*) target=1 ;;
      runtime/*) target=2 ;;
      training/*) target=3 ;;
      distribute/*)
        name="${header#distribute/}"
        target=$(public_layer "${name%.h}")
        ;;
      *) continue ;;  # a tool's own header, beside it
    esac
    problem=""
    if [[ "$target" == unknown ]]; then
      problem="a public header with no layer (add it to scripts/check_layers.sh)"
    elif ((target > layer)); then
      problem="${names[layer]} must not include ${names[target]}"
    elif [[ "$header" == comm/* && "$file" != src/comm/* && "$header" != comm/backend.h ]]; then
      problem="a backend is reached only through comm/backend.h"
    elif [[ "$file" == python/src/* && "$header" != distribute/* ]]; then
      problem="the Python module is built on the public API (include/distribute/) only"
    fi
    [[ -z "$problem" ]] && continue
    entry="$file: $header"
    is_known=0
    for k in "${known[@]}"; do [[ "$k" == "$entry" ]] && is_known=1; done
    if ((is_known)); then
      found+=("$entry")
    else
      echo "check_layers: $entry: $problem"
      status=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find src include tools examples python/src -type f \( -name '*.h' -o -name '*.cc' \) | sort)

for k in "${known[@]}"; do
  seen=0
  for f in "${found[@]}"; do [[ "$f" == "$k" ]] && seen=1; done
  if ((!seen)); then
    echo "check_layers: '$k' is listed as a known exception but no longer occurs: remove it from the list"
    status=1
  fi
done
if ((status == 0)); then
  echo "check_layers: every include runs down the layers (${#known[@]} known exception(s))"
fi
exit $status
