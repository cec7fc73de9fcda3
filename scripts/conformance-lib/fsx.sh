#!/usr/bin/env bash
# fsx.sh DIR: data-integrity runs inside DIR. Each run counts as one test:
#   full-S<seed>    fsx (asomers' Rust port, pinned in tools.sh), seeds 1 7 42 1337 31337, 20,000 ops each
#                   on a 256 KiB file, unaligned, with every operation fsx has: pread/pwrite, mmap
#                   read/write, msync(MS_INVALIDATE), truncate, fsync, fdatasync, posix_fallocate, punch
#                   hole, sendfile, copy_file_range, posix_fadvise, close/reopen.
#   reopen-S<seed>  seeds 3 and 99, 10,000 ops on a 2 MiB file, 4 KiB-aligned, with frequent
#                   close/reopen, invalidate and truncate: page cache coherency across opens. No
#                   posix_fallocate here: fsx 0.3.2 can issue a 0-byte one (EINVAL) when align > 1.
#   odirect         fio: 32 MiB of O_DIRECT random writes (4-64 KiB) read back and crc32c-verified
#                   (fsx has no O_DIRECT mode). Skipped if fio is missing or O_DIRECT is refused.
# Every run is verified against fsx's in-memory model / fio's checksums and limited to FSX_TIMEOUT
# seconds (default 300). Ends with 'fsx: N passed, N failed, N skipped'; exits 1 if a run failed.
set -u
dir=${1:?usage: fsx.sh DIR}
[ -d "$dir" ] || { echo "fsx: not a directory: $dir" >&2; exit 2; }
. "$(dirname "$0")/tools.sh"
bin=$(tool_bin fsx "$FSX_VERSION") || exit 2
limit=${FSX_TIMEOUT:-300}
ops=20000

logs=$(mktemp -d /tmp/octofs-fsx.XXXXXX)
files=$(mktemp -d "$dir/.fsx.XXXXXX") || { echo "fsx: cannot create a directory in $dir" >&2; exit 2; }
trap 'rm -rf "$files"' EXIT
passed=0 failed=0 skipped=0
report() { # NAME OUTCOME T0 [NOTE]
  case $2 in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; esac
  printf '%-16s %s %7ss %s\n' "$1" "$2" "$([ "$2" = SKIP ] && echo - || elapsed "$3")" "${4:-}"
}

# profile NAME FILE_LEN MIN MAX ALIGN then 'op=weight' pairs: writes $logs/NAME.toml.
profile() {
  local name=$1 len=$2 min=$3 max=$4 align=$5
  shift 5
  {
    printf 'flen = %s\n[opsize]\nmin = %s\nmax = %s\nalign = %s\n[weights]\n' "$len" "$min" "$max" "$align"
    for w in "$@"; do echo "${w%%=*} = ${w#*=}"; done
  } >"$logs/$name.toml"
}
profile full 262144 0 65536 1 close_open=1 read=10 write=10 mapread=10 mapwrite=10 invalidate=1 \
  truncate=5 fsync=1 fdatasync=1 posix_fallocate=3 punch_hole=3 sendfile=2 posix_fadvise=1 copy_file_range=3
profile reopen 2097152 4096 131072 4096 close_open=6 read=10 write=10 mapread=6 mapwrite=6 invalidate=4 \
  truncate=6 fsync=2 fdatasync=1 posix_fallocate=0 punch_hole=3 sendfile=1 posix_fadvise=2 copy_file_range=2

fsx_run() { # NAME PROFILE OPS SEED
  local t0 rc
  t0=$(date +%s.%N)
  mkdir -p "$logs/$1.artifacts"
  NO_COLOR=1 timeout -k 5 "$limit" "$bin" -q -f "$logs/$2.toml" -N "$3" -S "$4" -P "$logs/$1.artifacts" \
    "$files/$1.dat" >"$logs/$1.log" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q 'A-OK' "$logs/$1.log"; then
    report "$1" PASS "$t0"
  else
    report "$1" FAIL "$t0" "(exit $rc, log $logs/$1.log)"
    tail -n 25 "$logs/$1.log" | sed 's/^/    | /'
  fi
  rm -f "$files/$1.dat"
}

echo "== fsx $FSX_VERSION in $dir"
for seed in 1 7 42 1337 31337; do fsx_run "full-S$seed" full "$ops" "$seed"; done
for seed in 3 99; do fsx_run "reopen-S$seed" reopen "$((ops / 2))" "$seed"; done

t0=$(date +%s.%N)
if ! command -v fio >/dev/null 2>&1; then
  report odirect SKIP "$t0" "(fio not installed)"
elif ! dd if=/dev/zero of="$files/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
  report odirect SKIP "$t0" "(open with O_DIRECT refused)"
else
  (cd "$logs" && timeout -k 5 "$limit" fio --name=odirect --directory="$files" --filename=odirect.dat \
    --size=32m --direct=1 --ioengine=psync --rw=randwrite --bsrange=4k-64k --randrepeat=1 --randseed=4242 \
    --verify=crc32c --verify_fatal=1 --do_verify=1 --verify_state_save=0 --output="$logs/odirect.log") \
    >"$logs/odirect.out" 2>&1
  rc=$?
  if [ $rc = 0 ] && ! grep -qiE 'verify.*bad|err= *[1-9]' "$logs/odirect.log" "$logs/odirect.out"; then
    report odirect PASS "$t0"
  else
    report odirect FAIL "$t0" "(exit $rc, log $logs/odirect.log)"
    tail -n 20 "$logs/odirect.out" "$logs/odirect.log" | sed 's/^/    | /'
  fi
fi

[ $failed = 0 ] && rm -rf "$logs"
echo "fsx: $passed passed, $failed failed, $skipped skipped"
[ $failed = 0 ]
