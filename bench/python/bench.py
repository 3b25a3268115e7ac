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

`--hour` measures instead reading an hour of summaries: Python's
`store.read` against `bagel read`, over the same range with the same
trust options. The hour is written and closed by the real binaries on
a clock that libfaketime runs `--speed` times fast (one `faketime`
wrapper, so every process under it shares one timeline): a
`bagel-server` (the writer's and the metronome's signed time), `bagel
write` under a lease from `bagel acquire`, and `bagel metronome`. Then,
on true time, `bagel summarize --attest-key` and `bagel retain`, which
removes the bags once their summaries check, so both readers read the
summaries alone:

    python bench/python/bench.py --bin-dir target/release --hour

Needs the `bagel` wheel (release build for figures worth quoting),
grpcio-tools, PyNaCl and redis-py in the interpreter, and `redis-server`
on PATH.
"""

from __future__ import annotations

import argparse
import json
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


HOUR_LOG = "hour"


def start_server(cmd: list[str]) -> tuple[subprocess.Popen, str, str]:
    """A bagel-server from `cmd`; returns it, its URL and its public key."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    key = ""
    for line in proc.stdout:
        k = re.match(r"public key ([0-9a-f]{64})", line)
        if k:
            key = k.group(1)
        m = re.search(r" listening on ([0-9.:]+),", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, f"http://{m.group(1)}", key
    raise SystemExit("bagel-server did not start")


def sleep_until(t: float) -> None:
    """Sleeps until the (possibly sped-up) wall clock reads `t`."""
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 1.0))


def hour_child(bin_dir: Path, store_dir: Path, rate: int, size: int) -> None:
    """Runs under the `faketime` wrapper (see `--hour`): makes an hour of
    `rate` messages a second in `store_dir`, written under a lease and
    closed; prints what the summarizer and the readers need as JSON."""
    bagel = str(bin_dir / "bagel")
    url = f"file://{store_dir / 'bags'}"
    (store_dir / "bags").mkdir()
    server, server_url, server_key = start_server(
        [str(bin_dir / "bagel-server"), "--listen", "127.0.0.1:0", "--unsafe-skip-restart-wait", "--max-ttl", "2h"]
    )
    env = {**os.environ, "BAGEL_SERVER": server_url, "BAGEL_STATE_DIR": str(store_dir)}

    def cli(*args: str) -> str:
        return subprocess.run([bagel, *args], env=env, stdout=subprocess.PIPE, check=True, text=True).stdout

    metronome = subprocess.Popen(
        [bagel, "metronome", "--store", url, "--log", HOUR_LOG, "--max-idle-listing", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        lease = store_dir / "lease.json"
        lease.write_text(cli("acquire", "bench-hour", "--ttl", "70m", "--json"))
        stamps = store_dir / "stamps.txt"
        with open(stamps, "w") as out:
            writer = subprocess.Popen(
                [bagel, "write", "--store", url, "--log", HOUR_LOG, "--lease", str(lease), "--no-sync",
                 "--keep-going", "--writer-id", "bench-hour"],
                env=env, stdin=subprocess.PIPE, stdout=out, text=True,
            )
            pad = "x" * max(size - 9, 0)
            start = time.time()
            sent = 0
            # `rate` lines for every second of the (fast) clock, for an hour.
            while (now := time.time()) < start + 3600:
                due = int((now - start) * rate)
                writer.stdin.write("".join(f"{i:08d} {pad}\n" for i in range(sent, due)))
                writer.stdin.flush()
                sent = due
                time.sleep(0.5)
            writer.stdin.close()
            assert writer.wait() == 0, "bagel write failed"
        written = [int(line.split()[0]) for line in stamps.read_text().splitlines() if not line.startswith("FAILED")]
        failed = sum(int(line.split()[1]) for line in stamps.read_text().splitlines() if line.startswith("FAILED"))
        cli("release", "--lease", str(lease))
        # Whole minutes, from the first message's to the last one's; done
        # once the metronome has had time to close the last bag.
        first = written[0] // 60_000_000 * 60_000_000
        end = (written[-1] // 60_000_000 + 1) * 60_000_000
        sleep_until(end / 1e6 + 10)
    finally:
        metronome.kill()
        metronome.wait()
        server.kill()
        server.wait()
    print(json.dumps({
        "url": url, "server_key": server_key, "start": first, "end": end, "written": len(written),
        "failed": failed, "why": sorted({re.sub(r"[0-9.]+", "N", line.split(None, 2)[2])
                                         for line in stamps.read_text().splitlines() if line.startswith("FAILED")}),
    }))


def summarize_and_retain(bin_dir: Path, store_dir: Path, hour: dict) -> None:
    """On true time, the hour well past: `bagel summarize` attests every
    minute (checking each witness against the hour's server key), and
    `bagel retain` removes the bags its summaries hold. Not on the fast
    clock, where every store call's 10 s bound would shrink by `--speed`
    while reading an hour of bags."""
    server, server_url, _ = start_server(
        [str(bin_dir / "bagel-server"), "--listen", "127.0.0.1:0", "--unsafe-skip-restart-wait"]
    )
    try:
        common = ["--server", server_url, "--store", hour["url"], "--log", HOUR_LOG]
        subprocess.run(
            [str(bin_dir / "bagel"), "summarize", *common, "--attest-key", str(store_dir / "attest-key"),
             "--key", hour["server_key"], "--from", str(hour["start"]), "--to", str(hour["end"])],
            stdout=subprocess.DEVNULL, check=True,
        )
        subprocess.run([str(bin_dir / "bagel"), "retain", *common, "--keep-bags", "10m"],
                       stdout=subprocess.DEVNULL, check=True)
    finally:
        server.kill()
        server.wait()


def public_key_of(seed_file: Path) -> str:
    """The ed25519 public key (hex) of a key file of 64 hex digits."""
    from nacl.signing import SigningKey

    return SigningKey(bytes.fromhex(seed_file.read_text().strip())).verify_key.encode().hex()


def bench_hour(bin_dir: Path, rate: int, size: int, speed: int, repeat: int) -> dict:
    import bagel

    with tempfile.TemporaryDirectory() as d:
        store_dir = Path(d)
        # Starting two hours ago, so that the whole hour is in the past
        # when it is read on true time. An offset rather than a date: the
        # wrapper shares a relative clock's start with every process under
        # it, so processes started later (summarize, retain) agree.
        cmd = ["faketime", "-f", f"-2h x{speed}", sys.executable, __file__, "--hour-child", str(store_dir),
               "--bin-dir", str(bin_dir), "--rate", str(rate), "--size", str(size)]
        # The wrapper names its semaphore after its pid, and refuses to
        # start when a killed wrapper left one behind under the same pid:
        # another pid will do.
        for _ in range(10):
            made = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if "_open: File exists" not in made.stderr:
                break
        if made.returncode != 0:
            raise SystemExit(f"making the hour failed:\n{made.stderr}")
        hour = json.loads(made.stdout.splitlines()[-1])
        summarize_and_retain(bin_dir, store_dir, hour)
        bags = store_dir / "bags" / HOUR_LOG
        assert not any(p.name.endswith(".data") for p in bags.rglob("*")), "retention left bags behind"
        attester = public_key_of(store_dir / "attest-key")
        rust_cmd = [str(bin_dir / "bagel"), "read", "--store", hour["url"], "--log", HOUR_LOG,
                    "--from", str(hour["start"]), "--to", str(hour["end"]), "--key", hour["server_key"],
                    "--trust-summarizer", attester, "--no-close", "--json"]
        store = bagel.open_store(hour["url"], keys=[hour["server_key"]])
        acknowledged = {
            int(line.split()[0]) for line in (store_dir / "stamps.txt").read_text().splitlines()
            if not line.startswith("FAILED")
        }
        rust_s, py_s = [], []
        for _ in range(repeat):
            with open(store_dir / "read.jsonl", "w") as out:
                t = time.perf_counter()
                subprocess.run(rust_cmd, stdout=out, stderr=subprocess.DEVNULL, check=True)
                rust_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            messages = store.read(HOUR_LOG, start=hour["start"], end=hour["end"], trust_summarizer=[attester])
            n = sum(1 for _ in messages)
            py_s.append(time.perf_counter() - t)
            with open(store_dir / "read.jsonl") as f:
                read = [m["timestamp_us"] for m in map(json.loads, f) if m.get("kind") == "message"]
            # The same messages for both; every acknowledged one among them
            # (a batch that failed with an unknown outcome, a timeout, may
            # be there too).
            assert n == len(read), (n, len(read))
            assert acknowledged <= set(read), len(acknowledged - set(read))
            assert messages.verified and not messages.rejected and not messages.problems
    minutes = (hour["end"] - hour["start"]) // 60_000_000
    return {"messages": n, "minutes": minutes, "acknowledged": len(acknowledged), "failed": hour["failed"],
            "why": hour["why"], "rust_s": min(rust_s), "py_s": min(py_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=str(REPO / "target" / "release"), type=Path)
    ap.add_argument("--seconds", default=5.0, type=float, help="per measurement")
    ap.add_argument("--batch", default=100, type=int, help="messages per written batch")
    ap.add_argument("--size", default=100, type=int, help="bytes per message")
    ap.add_argument("--hour", action="store_true", help="only: read an hour of summaries, Python against Rust")
    ap.add_argument("--rate", default=100, type=int, help="with --hour: messages per second of the hour")
    ap.add_argument("--speed", default=20, type=int, help="with --hour: how many times fast the hour's clock runs")
    ap.add_argument("--repeat", default=3, type=int, help="with --hour: reads of each reader (the best counts)")
    ap.add_argument("--grpcio-child", metavar="ADDR", help=argparse.SUPPRESS)
    ap.add_argument("--hour-child", metavar="DIR", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.grpcio_child:
        print(grpcio_child(a.grpcio_child, a.seconds))
        return
    if a.hour_child:
        hour_child(a.bin_dir, a.hour_child, a.rate, a.size)
        return
    if a.hour:
        h = bench_hour(a.bin_dir, a.rate, a.size, a.speed, a.repeat)
        print(f"an hour of summaries ({h['minutes']} one-minute summaries, {h['messages']:,} messages of "
              f"{a.size} B, attested; bags removed), best of {a.repeat}")
        print("| reader | seconds | messages/s |")
        print("|---|---:|---:|")
        print(f"| Python `store.read` | {h['py_s']:.3f} | {h['messages'] / h['py_s']:,.0f} |")
        print(f"| `bagel read --json` (Rust) | {h['rust_s']:.3f} | {h['messages'] / h['rust_s']:,.0f} |")
        print(f"\nPython read time / Rust read time: {h['py_s'] / h['rust_s']:.2f}")
        if h["failed"]:
            # On a fast clock a stall of the host is a long one: batches
            # refused (their bag closed, the clock check failing) or timed
            # out (stored or not). The readers read what was stored.
            print(f"({h['acknowledged']:,} messages acknowledged; {h['failed']:,} failed while writing:")
            for why in h["why"]:
                print(f"  {why}")
            print(")")
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
