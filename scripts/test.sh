#!/usr/bin/env bash
# Runs the whole garden-ring test suite on a fresh Debian machine (as root): installs what is
# missing, then formatting, lints, a build of the binaries and every test.
#
# Environment:
#   NEXTEST_PROFILE        nextest profile to use (optional; nextest reads it itself).
#   GARDEN_RING_FUZZ_SECS  seconds of generated input per fuzz target (default 20).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

banner() {
    printf '\n==> %s\n' "$*"
}

apt_updated=0
# Installs Debian packages (apt-get update runs once, on first use).
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        apt-get update
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

# Installs what the suite needs and is missing. Add system packages (etcd-server, bind9, ...)
# here as the suite grows.
ensure_tools() {
    local packages=()
    command -v cc >/dev/null 2>&1 || packages+=(build-essential)
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        command -v curl >/dev/null 2>&1 || packages+=(curl ca-certificates)
    fi
    # A real BIND 9 for the RFC 2136 tests (tests/src/bind.rs); named lives in /usr/sbin.
    command -v named >/dev/null 2>&1 || [ -x /usr/sbin/named ] || packages+=(bind9)
    command -v tsig-keygen >/dev/null 2>&1 || [ -x /usr/sbin/tsig-keygen ] || packages+=(bind9-utils)
    command -v dig >/dev/null 2>&1 || packages+=(bind9-dnsutils)
    # promtool checks the Prometheus alert rules in deploy/prometheus.
    command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
    # Network namespaces for ring-chaos.
    command -v ip >/dev/null 2>&1 || packages+=(iproute2)
    # A real etcd for the backup tests (the etcd driver, snapshots and restores).
    command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
    command -v etcdctl >/dev/null 2>&1 || packages+=(etcd-client)
    # A real S3 API for the backup tests (tests/src/s3.rs): moto_server, from pip below.
    if ! command -v moto_server >/dev/null 2>&1; then
        command -v python3 >/dev/null 2>&1 || packages+=(python3)
        python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
    fi
    if [ "${#packages[@]}" -gt 0 ]; then
        banner "installing packages: ${packages[*]}"
        apt_install "${packages[@]}"
    fi

    if ! command -v moto_server >/dev/null 2>&1; then
        banner "installing moto[server] (an S3 API server for the backup tests)"
        # Debian's system Python refuses pip installs without this flag (PEP 668).
        python3 -m pip install 'moto[server]' ||
            python3 -m pip install --break-system-packages 'moto[server]'
    fi

    if ! command -v cargo >/dev/null 2>&1; then
        banner "installing a Rust toolchain (rustup)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
        banner "adding rustup components: rustfmt clippy"
        rustup component add rustfmt clippy
    fi
    if ! cargo nextest --version >/dev/null 2>&1; then
        banner "installing cargo-nextest"
        cargo install cargo-nextest --locked
    fi
}

banner "checking tools"
ensure_tools

banner "cargo fmt --all --check"
cargo fmt --all --check

banner "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

banner "promtool check rules / test rules deploy/prometheus"
promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts_test.yml)

banner "cargo build --workspace --bins (the integration tests start these binaries)"
cargo build --workspace --bins

# The fuzz targets (ring/tests/fuzz.rs) run on their corpus, then on generated input for this
# many seconds each; `GARDEN_RING_FUZZ_SECS=600 ./scripts/test.sh` fuzzes longer.
export GARDEN_RING_FUZZ_SECS="${GARDEN_RING_FUZZ_SECS:-20}"
banner "cargo nextest run --workspace --no-fail-fast${NEXTEST_PROFILE:+ (profile $NEXTEST_PROFILE)}, fuzzing ${GARDEN_RING_FUZZ_SECS} s per target"
cargo nextest run --workspace --no-fail-fast

# Zone loss in network namespaces, with real processes (chaos/README.md). Fails on any split
# brain, any lost acknowledged write in zone-partition, any write acknowledged before the
# restored snapshot missing, or an RTO over 15 s.
if [ "$(id -u)" -eq 0 ]; then
    banner "ring-chaos run: zone-kill, zone-partition, leader-zone-kill"
    cargo run -q -p garden-ring-chaos --bin ring-chaos -- run \
        --scenario zone-kill --scenario zone-partition --scenario leader-zone-kill \
        --out target/chaos
else
    banner "ring-chaos skipped: it needs root (network namespaces); CI runs as root"
fi

banner "all checks passed"
