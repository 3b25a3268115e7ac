#!/usr/bin/env python3
"""/metrics of a real bagel-server, scraped over real HTTP before and after a
known sequence of gRPC calls, and parsed by the official Prometheus Python
client's OpenMetrics parser (strict: a malformed exposition fails here),
asked for by `Accept` as Prometheus asks. Every counter moves by exactly
what the sequence did; gauges come back. The default answer (no `Accept`)
is the classic Prometheus text format, parsed by the same client's classic
parser, with the same numbers.

Run by tests/support/python.sh against a server of its own (so nothing
else moves its counters); exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_classic

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import bagel_client  # noqa: E402  (generates the gRPC code from proto/)

OPENMETRICS = "application/openmetrics-text"
CLASSIC = "text/plain; version=0.0.4"
# What Prometheus sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def scrape(http: str, openmetrics: bool = True) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics: (sample name, labels) -> value, in
    OpenMetrics (asked for) or in the classic format (the default)."""
    headers = {"Accept": PROMETHEUS_ACCEPT} if openmetrics else {}
    request = urllib.request.Request(f"http://{http}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as r:
        content_type = r.headers["Content-Type"]
        assert content_type.startswith(OPENMETRICS if openmetrics else CLASSIC), content_type
        text = r.read().decode()
    samples = {}
    parse = parse_openmetrics if openmetrics else parse_classic
    for family in parse(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def key(name: str, **labels) -> tuple[str, frozenset]:
    return (name, frozenset(labels.items()))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True, help="gRPC HOST:PORT")
    parser.add_argument("--http", required=True, help="HTTP side port HOST:PORT")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bagel-pb-") as gen:
        lease_pb2, lease_pb2_grpc, witness_pb2, _ = bagel_client.generate_code(Path(gen))
    channel = grpc.insecure_channel(args.server)
    leases = lease_pb2_grpc.LeaseServiceStub(channel)
    full, tentative = witness_pb2.MODE_FULL, witness_pb2.MODE_TENTATIVE

    def acquire(name, mode=full, ttl_us=5_000_000, wait_us=0, owner="metrics-test"):
        return lease_pb2.AcquireRequest(
            names=[name],
            deadline_us=time.time_ns() // 1000 + ttl_us,
            owner=owner,
            mode=mode,
            wait_us=wait_us,
        )

    def refused(request):
        try:
            leases.Acquire(request, timeout=10)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.ABORTED, e
            return
        raise AssertionError(f"granted: {request}")

    before = scrape(args.http)

    a = leases.Acquire(acquire("a"), timeout=10).grant  # grant, full
    refused(acquire("a", owner="rival"))  # conflict, full
    refused(acquire("a", owner="rival", wait_us=20_000))  # conflict after a wait
    b = leases.Acquire(acquire("b", mode=tentative), timeout=10).grant  # grant, tentative
    refused(acquire("b", mode=tentative, owner="rival"))  # conflict, tentative
    leases.Renew(
        lease_pb2.RenewRequest(lease_id=a.lease_id, token=a.token, deadline_us=time.time_ns() // 1000 + 5_000_000),
        timeout=10,
    )
    leases.Upgrade(lease_pb2.UpgradeRequest(lease_id=b.lease_id, token=b.token), timeout=10)
    batch = leases.Batch(
        lease_pb2.BatchRequest(
            ops=[
                lease_pb2.BatchOp(acquire=acquire("c")),  # grant, full
                lease_pb2.BatchOp(acquire=acquire("e")),  # grant, full
                lease_pb2.BatchOp(acquire=acquire("a", owner="rival")),  # conflict, full
            ]
        ),
        timeout=10,
    )
    kinds = [r.WhichOneof("result") for r in batch.results]
    assert kinds == ["grant", "grant", "error"], kinds
    c, e = batch.results[0].grant, batch.results[1].grant
    # A holder that misses its deadline, and a successor that waits for it
    # server-side and breaks it.
    leases.Acquire(acquire("d", ttl_us=100_000, owner="stalled"), timeout=10)
    d2 = leases.Acquire(acquire("d", wait_us=5_000_000), timeout=10).grant
    assert d2.names[0].previous.ended == witness_pb2.ENDED_BROKEN, d2
    for g in (a, b, c, e, d2):
        leases.Release(lease_pb2.ReleaseRequest(lease_id=g.lease_id, token=g.token), timeout=10)

    after = scrape(args.http)
    classic = scrape(args.http, openmetrics=False)
    channel.close()

    def delta(name, **labels):
        k = key(name, **labels)
        return after.get(k, 0.0) - before.get(k, 0.0)

    expected = [
        # What happened to leases.
        (("bagel_grants_total",), {"mode": "full"}, 5),  # a, c, e, d, d2
        (("bagel_grants_total",), {"mode": "tentative"}, 1),  # b
        (("bagel_conflicts_total",), {"mode": "full"}, 3),  # 2 unary + 1 in the batch
        (("bagel_conflicts_total",), {"mode": "tentative"}, 1),
        (("bagel_renewals_total",), {}, 1),
        (("bagel_upgrades_total",), {}, 1),
        (("bagel_releases_total",), {"mode": "full"}, 5),  # b was upgraded first
        (("bagel_releases_total",), {"mode": "tentative"}, 0),
        (("bagel_breaks_total",), {"mode": "full"}, 1),
        (("bagel_breaks_total",), {"mode": "tentative"}, 0),
        (("bagel_expiries_total",), {"mode": "full"}, 1),
        (("bagel_expiries_total",), {"mode": "tentative"}, 0),
        # Gauges come back to where they were.
        (("bagel_leases_held",), {"mode": "full"}, 0),
        (("bagel_leases_held",), {"mode": "tentative"}, 0),
        (("bagel_names_held",), {"mode": "full"}, 0),
        (("bagel_waiters",), {}, 0),
        # Requests, by method and status code.
        (("bagel_rpc_duration_seconds_count",), {"method": "Acquire", "code": "OK"}, 4),
        (("bagel_rpc_duration_seconds_count",), {"method": "Acquire", "code": "ABORTED"}, 3),
        (("bagel_rpc_duration_seconds_count",), {"method": "Renew", "code": "OK"}, 1),
        (("bagel_rpc_duration_seconds_count",), {"method": "Upgrade", "code": "OK"}, 1),
        (("bagel_rpc_duration_seconds_count",), {"method": "Release", "code": "OK"}, 5),
        (("bagel_rpc_duration_seconds_count",), {"method": "Batch", "code": "OK"}, 1),
        (("bagel_batch_ops_total",), {"op": "acquire", "code": "OK"}, 2),
        (("bagel_batch_ops_total",), {"op": "acquire", "code": "ABORTED"}, 1),
        (("bagel_batch_size_count",), {}, 1),
        (("bagel_batch_size_sum",), {}, 3),
        # Signatures: six lone witnesses (a, b, renew a, upgrade b, d, d2)
        # and one Merkle batch of two (c, e).
        (("bagel_signature_group_size_count",), {}, 7),
        (("bagel_signature_group_size_sum",), {}, 8),
    ]
    failures = 0
    for (name,), labels, want in expected:
        got = delta(name, **labels)
        ok = got == want
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{labels or ''}: {got:+g} (expected {want:+g})")
        # Nothing moved these between the two scrapes: both formats agree.
        same = classic.get(key(name, **labels)) == after.get(key(name, **labels))
        failures += not same
        print(f"{'ok  ' if same else 'FAIL'} {name}{labels or ''} in the classic format: {classic.get(key(name, **labels))}")
    # Present, with sensible values.
    for name, least in (
        ("process_resident_memory_bytes", 1),
        ("process_open_fds", 1),
        ("process_cpu_seconds_total", 0),
    ):
        value = after.get(key(name))
        ok = value is not None and value >= least
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name} = {value}")
    for name, want in (("bagel_ready", 1), ("bagel_restart_wait_remaining_seconds", 0), ("bagel_clock_healthy", 1)):
        value = after.get(key(name))
        ok = value == want
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name} = {value} (expected {want})")
    # Never a lease name as a label.
    leaked = [k for k in after if any(v in ("a", "b", "c", "d", "e") for _, v in k[1])]
    failures += bool(leaked)
    print(f"{'ok  ' if not leaked else 'FAIL'} no lease name in any label {leaked or ''}")

    checks = 2 * len(expected) + 7
    print(f"{checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
