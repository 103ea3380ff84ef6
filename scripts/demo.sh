#!/usr/bin/env bash
# Runs the local garden-ring demo: builds the release binaries, then starts a three-zone ring of
# ringd processes on loopback with `ringctl demo`. Arguments go to `ringctl demo` (see --help).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cargo build --release --bins
exec "$root/target/release/ringctl" demo "$@"
