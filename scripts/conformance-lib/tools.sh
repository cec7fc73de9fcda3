# Sourced by the conformance runners: finds or installs the pinned external tools.
#
# The test tools are crates built from source with `cargo install --locked` (their own Cargo.lock)
# into a per-user cache that every run and every clone reuses, so only the first run compiles them.
# Nothing here is taken from PATH: a run always uses the versions pinned below.
#   OCTOFS_CONFORMANCE_TOOLS  the cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/octofs-conformance)

PJDFSTEST_VERSION=0.2.2
FSX_VERSION=0.3.2
tools_root=${OCTOFS_CONFORMANCE_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/octofs-conformance}

# tool_bin CRATE VERSION: prints the path of the crate's binary, installing that exact version first
# if the cache holds another one or none. cargo records what it installed in .crates.toml.
tool_bin() {
  local crate=$1 version=$2
  if ! grep -qF "\"$crate $version (" "$tools_root/.crates.toml" 2>/dev/null || [ ! -x "$tools_root/bin/$crate" ]; then
    echo "conformance: installing $crate $version into $tools_root (cargo install --locked, first run only)" >&2
    command -v cargo >/dev/null 2>&1 || { echo "conformance: cargo not found, cannot install $crate" >&2; return 2; }
    timeout -k 10 1800 cargo install --locked --quiet --force --root "$tools_root" "$crate@$version" >&2 \
      || { echo "conformance: cargo install $crate@$version failed" >&2; return 2; }
  fi
  echo "$tools_root/bin/$crate"
}

# elapsed T0: seconds since T0 (from `date +%s.%N`), one decimal.
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
