"""Run by test_clocks.py in a process whose clock libfaketime skews: does
what the test asks and prints, per operation, one JSON line saying what it
raised (`class` None when it succeeded).

    skewed_child.py clock SERVER STORE S3_LEASE_STORE LEASE_KEY
        a writer, a metronome and an S3 lease acquire on this clock, with
        the Roughtime service of $BAGEL_ROUGHTIME_ADDR as signed time;
    skewed_child.py late SERVER STORE LOG
        writes a batch, waits for a line on stdin, writes another; signed
        time from SERVER (skewed alike).
"""

from __future__ import annotations

import json
import os
import sys

import bagel


def outcome(op: str, call) -> None:
    try:
        result = call()
    except bagel.BagelError as e:
        line = {"op": op, "class": type(e).__name__, "message": str(e), "retryable": e.retryable}
        for attr in ("offset", "allowed", "log", "bag"):
            line[attr] = getattr(e, attr, None)
    else:
        line = {"op": op, "class": None, "result": result}
    print(json.dumps(line), flush=True)


def clock(server: str, store_url: str, lease_store: str, lease_key: str) -> None:
    roughtime = [(os.environ["BAGEL_ROUGHTIME_ADDR"], os.environ["BAGEL_ROUGHTIME_KEY"])]
    client = bagel.Client(server, roughtime=roughtime)
    lease = client.acquire("clock-off", ttl=60)
    store = bagel.open_store(store_url, client=client)
    writer = store.writer("clock-off", lease)
    outcome("write", lambda: writer.write([b"on a clock that is off"]))
    outcome("metronome", lambda: store.metronome("clock-off").tick())
    s3 = bagel.Client(lease_store=lease_store, lease_key=lease_key, roughtime=roughtime)
    outcome("s3 acquire", lambda: s3.acquire("clock-off", ttl=10).id)


def late(server: str, store_url: str, log: str) -> None:
    client = bagel.Client(server)
    store = bagel.open_store(store_url, client=client)
    with client.lease("late-writer", ttl=10) as lease:
        writer = store.writer(log, lease, writer_id="skewed")
        outcome("first", lambda: writer.write([b"on time"]))
        # The test closes bags on true time, then says go.
        sys.stdin.readline()
        outcome("second", lambda: writer.write([b"late"]))


if __name__ == "__main__":
    {"clock": clock, "late": late}[sys.argv[1]](*sys.argv[2:])
