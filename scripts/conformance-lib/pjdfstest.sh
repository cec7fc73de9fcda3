#!/usr/bin/env bash
# pjdfstest.sh DIR: runs the POSIX conformance suite pjdfstest (the Rust port, pinned in tools.sh)
# inside DIR, which scripts/conformance mounts with allow_other and default_permissions.
#
# As root it covers everything Linux supports: chown, setuid bits and the tests that switch to two
# unprivileged users (nobody and `tests`, created here as a system user if missing). Opt-in features:
# posix_fallocate, utime_now, utimensat, rename_ctime (the others are BSD-only). Cross-device
# (EXDEV) tests use a scratch directory under /dev/shm when that is another file system.
# Ends with 'pjdfstest: N passed, N failed, N skipped'; exits 1 if a test failed or the run did not
# finish within PJD_TIMEOUT seconds (default 1200).
set -u
dir=${1:?usage: pjdfstest.sh DIR}
[ -d "$dir" ] || { echo "pjdfstest: not a directory: $dir" >&2; exit 2; }
. "$(dirname "$0")/tools.sh"
bin=$(tool_bin pjdfstest "$PJDFSTEST_VERSION") || exit 2
limit=${PJD_TIMEOUT:-1200}

[ "$(id -u)" = 0 ] || echo "pjdfstest: not root, so the root-only tests are skipped" >&2
other=tests
if ! id "$other" >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "pjdfstest: user '$other' is missing and only root can add it" >&2; exit 2; }
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$other" \
    || { echo "pjdfstest: cannot add user '$other'" >&2; exit 2; }
fi

scratch=$(mktemp -d /tmp/octofs-pjdfstest.XXXXXX)
second=
trap 'rm -rf "$scratch" ${second:+"$second"}' EXIT
if [ -d /dev/shm ] && [ "$(stat -c %d /dev/shm)" != "$(stat -c %d "$dir")" ]; then
  second=$(mktemp -d /dev/shm/octofs-pjdfstest.XXXXXX)
  chmod 755 "$second"
fi

cat >"$scratch/config.toml" <<TOML
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = 0.01
allow_remount = false
expected_failures = []

[dummy_auth]
entries = [["nobody", "$(id -gn nobody)"], ["$other", "$(id -gn "$other")"]]
TOML

echo "== pjdfstest $PJDFSTEST_VERSION in $dir (cross-device dir: ${second:-none})"
t0=$(date +%s.%N)
extra=()
[ -n "$second" ] && extra=(-s "$second")
NO_COLOR=1 RUST_BACKTRACE=0 timeout -k 10 "$limit" "$bin" -c "$scratch/config.toml" -p "$dir" "${extra[@]}" \
  >"$scratch/out" 2>&1
rc=$?
sed -i 's/\x1b\[[0-9;]*m//g' "$scratch/out"
cat "$scratch/out"

# One line per test: '<name> <outcome>'.
count() { grep -cE "^[^[:space:]]+[[:space:]]+($1)\$" "$scratch/out"; }
passed=$(count ok)
failed=$(count 'FAILED|PASSED UNEXPECTEDLY')
skipped=$(count skipped)
echo
echo "== pjdfstest took $(elapsed "$t0")s (exit status $rc)"
grep -E '^[^[:space:]]+[[:space:]]+(FAILED|PASSED UNEXPECTEDLY)$' "$scratch/out" | awk '{print "   failed: " $1}'
if ! grep -q '^Summary:' "$scratch/out"; then
  echo "   pjdfstest did not finish (timed out after ${limit}s or crashed)"
  failed=$((failed + 1))
fi
echo "pjdfstest: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ] && [ "$rc" = 0 ]
