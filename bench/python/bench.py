#!/usr/bin/env python3
"""bagel from Python, against the alternatives a Python user has, in one run:

* lease cycles (acquire + release of one name, one after another, one
  thread): the `bagel` package; the pure-grpcio client of
  examples/python/bagel_client.py (generated code, the same server); and
  redis-py `SET NX PX` plus a Lua compare-and-delete on a local Redis;
* bags: messages/s written from Python (batches of --batch messages of
  --size bytes to a directory store), and read back from Python against
  the Rust reader (`bagel read --json`, output to /dev/null) on the same
  log.

Every server is started here on 127.0.0.1 and stopped at the end:

    python bench/python/bench.py --bin-dir target/release --seconds 5

Needs the `bagel` wheel (release build for figures worth quoting),
grpcio-tools, PyNaCl and redis-py in the interpreter, and `redis-server`
on PATH.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_bagel_server(bin_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [str(bin_dir / "bagel-server"), "--listen", "127.0.0.1:0", "--unsafe-skip-restart-wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    for line in proc.stdout:
        m = re.search(r" listening on ([0-9.:]+),", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, m.group(1)
    raise SystemExit("bagel-server did not start")


def start_redis() -> tuple[subprocess.Popen, int]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not on PATH (Debian: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:
        if "Ready to accept connections" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, port
    raise SystemExit("redis-server did not start")


def rate(seconds: float, cycle) -> tuple[float, int]:
    """Runs `cycle` back to back for `seconds`; returns (per second, count)."""
    n = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        cycle()
        n += 1
    return n / (time.perf_counter() - start), n


def bench_bagel(addr: str, seconds: float) -> float:
    import bagel

    client = bagel.Client(f"http://{addr}")

    def cycle():
        client.acquire("bench-bagel", ttl=5).release()

    return rate(seconds, cycle)[0]


def bench_grpcio(addr: str, seconds: float) -> float:
    """In a process of its own: the generated code's package is `bagel.v1`,
    which the `bagel` package would shadow."""
    out = subprocess.run(
        [sys.executable, __file__, "--grpcio-child", addr, "--seconds", str(seconds)],
        stdout=subprocess.PIPE, text=True, check=True,
    )
    return float(out.stdout)


def grpcio_child(addr: str, seconds: float) -> float:
    sys.path.insert(0, str(REPO / "examples" / "python"))
    import grpc
    from bagel_client import generate_code, verify_witness

    with tempfile.TemporaryDirectory() as gen:
        # Regular packages, so that the generated `bagel.v1` wins over the
        # installed `bagel` package (a namespace package never does).
        (Path(gen) / "bagel" / "v1").mkdir(parents=True)
        (Path(gen) / "bagel" / "__init__.py").touch()
        (Path(gen) / "bagel" / "v1" / "__init__.py").touch()
        lease_pb2, lease_pb2_grpc, witness_pb2, _ = generate_code(Path(gen))
        channel = grpc.insecure_channel(addr)
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        info = stub.ServerInfo(lease_pb2.ServerInfoRequest(), timeout=10)
        keys = {k.key_id: bytes(k.ed25519) for k in info.keys}

        def cycle():
            request = lease_pb2.AcquireRequest(names=["bench-grpcio"], ttl_us=5_000_000)
            grant = stub.Acquire(request, timeout=10).grant
            # As the bagel package does: every witness is checked.
            verify_witness(grant.witness, keys, witness_pb2)
            stub.Release(lease_pb2.ReleaseRequest(lease_id=grant.lease_id, token=grant.token), timeout=10)

        return rate(seconds, cycle)[0]


CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


def bench_redis(port: int, seconds: float) -> float:
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    release = r.register_script(CAD)
    token = os.urandom(16).hex()

    def cycle():
        assert r.set("bench-redis", token, nx=True, px=5000)
        assert release(keys=["bench-redis"], args=[token]) == 1

    return rate(seconds, cycle)[0]


def bench_bags(addr: str, bin_dir: Path, seconds: float, batch: int, size: int) -> dict:
    import bagel

    client = bagel.Client(f"http://{addr}")
    out = {}
    with tempfile.TemporaryDirectory() as d:
        store = bagel.open_store(d, client=client)
        payloads = [os.urandom(size // 2).hex().encode()[:size] for _ in range(batch)]
        with client.lease("bench-bags", ttl=10) as lease:
            writer = store.writer("bench", lease)
            per_s, batches = rate(seconds, lambda: writer.write(payloads))
            last = writer.max_written
        out["write"] = per_s * batch
        with store.metronome("bench", max_idle_listing=0) as m:
            assert m.wait_closed("bench", last, timeout=60)
        start = time.perf_counter()
        n = sum(1 for _ in store.read("bench"))
        py_read = time.perf_counter() - start
        assert n == batches * batch, (n, batches * batch)
        start = time.perf_counter()
        subprocess.run(
            [str(bin_dir / "bagel"), "--server", f"http://{addr}", "read", "--store", f"file://{d}", "--log",
             "bench", "--json"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        rust_read = time.perf_counter() - start
        out.update(messages=n, read=n / py_read, rust_read=n / rust_read, py_s=py_read, rust_s=rust_read)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=str(REPO / "target" / "release"), type=Path)
    ap.add_argument("--seconds", default=5.0, type=float, help="per measurement")
    ap.add_argument("--batch", default=100, type=int, help="messages per written batch")
    ap.add_argument("--size", default=100, type=int, help="bytes per message")
    ap.add_argument("--grpcio-child", metavar="ADDR", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.grpcio_child:
        print(grpcio_child(a.grpcio_child, a.seconds))
        return

    server, addr = start_bagel_server(a.bin_dir)
    redis_proc, redis_port = start_redis()
    try:
        cycles = {
            "bagel (Python package)": bench_bagel(addr, a.seconds),
            "bagel (pure grpcio, examples/python)": bench_grpcio(addr, a.seconds),
            "Redis (redis-py SET NX PX + Lua compare-and-delete)": bench_redis(redis_port, a.seconds),
        }
        bags = bench_bags(addr, a.bin_dir, a.seconds, a.batch, a.size)
    finally:
        server.kill()
        redis_proc.kill()
    print(f"lease cycles (acquire + release, one thread, {a.seconds:g} s each)")
    print("| client | cycles/s |")
    print("|---|---:|")
    for name, per_s in cycles.items():
        print(f"| {name} | {per_s:,.0f} |")
    print()
    print(f"bags ({a.batch} x {a.size} B per batch, directory store, one writer)")
    print("| what | messages/s |")
    print("|---|---:|")
    print(f"| write from Python | {bags['write']:,.0f} |")
    print(f"| read from Python ({bags['messages']:,} messages, {bags['py_s']:.2f} s) | {bags['read']:,.0f} |")
    print(f"| read by `bagel read --json` (Rust, {bags['rust_s']:.2f} s) | {bags['rust_read']:,.0f} |")
    print(f"\nPython read time / Rust read time: {bags['py_s'] / bags['rust_s']:.2f}")


if __name__ == "__main__":
    main()
