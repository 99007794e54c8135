# Sourced by the device scripts (device_check.sh, many_cores_check.sh):
# `bundle_prepare NAME` builds the release preset, checks that every binary
# in $BINS was built, fills $BUNDLE with them (../shared/tools/devbundle) and
# keeps $BUNDLE out of git. Needs BUILD, BUNDLE and BINS set.
bundle_prepare() {
  local name=$1
  # (each step returns on failure: callers run this under ||, where set -e is off)
  cmake --preset release || return 1
  cmake --build --preset release -j "${JOBS:-2}" || return 1
  local b
  for b in $BINS; do
    [ -x "$BUILD/$b" ] || { echo "$name: $BUILD/$b was not built" >&2; return 1; }
  done
  BUILD=$BUILD BINS=$BINS bash ../shared/tools/devbundle/make_bundle.sh "$BUNDLE" || return 1
  grep -qx "/$BUNDLE/" .git/info/exclude 2>/dev/null || echo "/$BUNDLE/" >> .git/info/exclude
}
