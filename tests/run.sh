#!/usr/bin/env bash
# The one test command. On a fresh machine it installs what the tests need,
# starts the real services on 127.0.0.1 (S3 server, Roughtime, NFS server,
# stale-cache FUSE mounts), builds the real binaries, runs every test of the
# workspace, then the Python client and its tests (examples/python,
# tests/python) and the JavaScript client (examples/js), lints both side
# ports' /metrics with promtool, checks the deployment in deploy/ (systemd
# unit, server list, migration steps, Kubernetes manifests), and stops the
# services.
# A test whose service is missing fails; nothing is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tests/support/common.sh
source tests/support/s3.sh
source tests/support/roughtime.sh
source tests/support/nfs.sh
source tests/support/browser.sh
source tests/support/python.sh
source tests/support/js.sh
source tests/support/promtool.sh
source tests/support/deploy.sh
source tests/support/dnsmasq.sh

# Each stop runs whatever the one before it did.
cleanup() { deploy_stop || true; metrics_lint_stop || true; py_server_stop || true; bindfs_stop || true; nfs_stop || true; roughtime_stop || true; s3_stop || true; }
trap cleanup EXIT

s3_start
# Headless Chromium for the status page test.
browser_install
# Real per-process clock skew (libfaketime) for the clock-fault tests and
# the fault run.
apt_install faketime
# A real DNS server for the members-found-by-DNS tests.
dnsmasq_install
# Prometheus's linter for both side ports' /metrics.
promtool_install

log "building binaries"
cargo build --workspace --bins --locked

# After the build: the readiness probes are our own binaries
# (`bagel time-check`, `bagel-nfs ls`).
roughtime_start
nfs_start
bindfs_start

log "running tests"
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast --failure-output final
  # nextest runs no doctests: the crates' examples (which run) are here.
  cargo test --workspace --doc --locked
else
  cargo test --workspace --locked --no-fail-fast
fi

# Any-language clients: the Python example (witnesses verified in Python),
# discovery by gRPC reflection, and /metrics parsed by prometheus-client.
python_tests

# The `bagel` Python package (PyO3): its wheel built with maturin, and its
# pytest suite against the real server, S3 (moto) and a directory store.
python_package_tests

# The JavaScript example: the same steps, witnesses verified with Node's
# crypto, conflict details decoded from grpc-status-details-bin.
js_tests

# Both side ports' /metrics (bagel-server --http, bagel metronome --http),
# parsed and linted by Debian's promtool.
log "promtool check metrics on both side ports"
metrics_lint

# The deployment of deploy/README.md: the systemd unit passes
# `systemd-analyze verify` (warnings included), and three members started
# as the unit starts them, with the client list filled in by the README's
# commands, route, grant, keep their keys over a restart and take a fourth;
# the Kubernetes manifests render, validate against the API schemas, keep
# their invariants, and their command runs the built server.
log "deploy checks (systemd unit, cluster list, migration steps, Kubernetes manifests)"
deploy_checks

# The randomized fault run: lease server, S3 server and closers killed at
# random while workers write to a directory, S3 and NFS; everything read
# back by two readers and audited. Its seed is printed; BAGEL_CHAOS_SEED
# repeats a run, BAGEL_CHAOS_DURATION makes it longer.
log "fault-injection run (bagel-chaos)"
chaos_out=$(mktemp -d -t bagel-chaos.XXXXXX)
cargo run -q --locked -p bagel-tests --bin bagel-chaos -- \
  --duration "${BAGEL_CHAOS_DURATION:-60s}" ${BAGEL_CHAOS_SEED:+--seed "$BAGEL_CHAOS_SEED"} --out "$chaos_out"
rm -rf "$chaos_out"
