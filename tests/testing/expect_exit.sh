# Sourced by the tools' command-line tests (tests/*/cli_test.sh): `expect CODE
# PATTERN ARGS...` runs "$bin" ARGS (within 120 s), and passes if it exits
# with CODE and its output matches the extended regular expression PATTERN;
# a failure is printed, counted in `fails` and returned as 1.
fails=0

expect() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$(timeout 120 "$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $(basename "$bin") $* -> exit $rc (want $code), output:"
    echo "$out" | tail -5
    echo "  (wanted /$pattern/)"
    fails=$((fails + 1))
    return 1
  fi
  echo "ok: $(basename "$bin") $* -> exit $rc"
}
