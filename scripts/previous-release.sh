#!/usr/bin/env bash
# Builds the binaries of the previous release (RELEASES.md) from this repository's own history
# and prints the directory holding them: ringd, ring-guard, ringctl. The mixed-version tests
# (tests/tests/mixed_version.rs) and `ring-chaos run --scenario rolling-upgrade` run them beside
# this tree's binaries.
#
# Cached under $HOME/.cache/garden-ring/release-<version>-<commit>/bin, so a machine pays the
# build once (about 8 minutes on 2 CPUs, debug profile); the build's target directory is removed
# afterwards (about 3 GB).
#
# Usage: scripts/previous-release.sh [--print-dir]
#   --print-dir   print the directory only if it is built already (exit 1 otherwise)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The previous release: keep in step with RELEASES.md.
PREVIOUS_VERSION=0.1.0
PREVIOUS_COMMIT=e0220b2

cache="$HOME/.cache/garden-ring/release-$PREVIOUS_VERSION-$PREVIOUS_COMMIT"
bin="$cache/bin"
built() {
    [ -x "$bin/ringd" ] && [ -x "$bin/ring-guard" ] && [ -x "$bin/ringctl" ]
}
if [ "${1:-}" = "--print-dir" ]; then
    built && echo "$bin" && exit 0
    exit 1
fi
if built; then
    echo "$bin"
    exit 0
fi

echo "building release $PREVIOUS_VERSION ($PREVIOUS_COMMIT) into $bin" >&2
if ! git cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null; then
    # A shallow clone: fetch the release's history.
    git fetch --quiet --unshallow 2>/dev/null || git fetch --quiet origin "$PREVIOUS_COMMIT"
fi
src="$cache/src"
rm -rf "$src" "$cache/target"
mkdir -p "$cache"
git worktree prune
git worktree add --quiet --detach "$src" "$PREVIOUS_COMMIT"
trap 'git worktree remove --force "$src" 2>/dev/null || true; rm -rf "$cache/target"' EXIT
(cd "$src" && CARGO_TARGET_DIR="$cache/target" CARGO_INCREMENTAL=0 \
    cargo build --quiet --locked -p garden-ring --bin ringd --bin ring-guard --bin ringctl)
mkdir -p "$bin.partial"
cp "$cache/target/debug/ringd" "$cache/target/debug/ring-guard" "$cache/target/debug/ringctl" \
    "$bin.partial/"
printf '%s %s\n' "$PREVIOUS_VERSION" "$PREVIOUS_COMMIT" >"$bin.partial/RELEASE"
rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "$bin"
