"""The clock failures, provoked for real: a Python process whose clock is
off (libfaketime) gets `ClockOff` from the Roughtime check, and a writer
whose bag a reader on true time has already closed gets `LateRejected`."""

from __future__ import annotations

import datetime
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import bagel
from conftest import PYTHON, Server, roughtime, s3_url, skewed_env

CHILD = str(Path(__file__).with_name("skewed_child.py"))


def bag_of(micros: int) -> str:
    """The bag (second) of a timestamp, in `Message.bag`'s form."""
    t = datetime.datetime.fromtimestamp(micros // 1_000_000, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def long_ttl_server():
    """Grants up to a minute, so that a lease taken on a clock 30 s ahead
    still has time left on it."""
    s = Server("--max-ttl", "60s")
    yield s
    s.kill()


def test_a_clock_30_s_ahead_is_clock_off_with_its_offset(long_ttl_server, tmp_path):
    roughtime()  # the service the child's Client asks
    (tmp_path / "bags").mkdir()
    out = subprocess.run(
        [PYTHON, CHILD, "clock", long_ttl_server.url, str(tmp_path / "bags"),
         s3_url(f"py-clock-{uuid.uuid4().hex}"), str(tmp_path / "lease-key")],
        env=skewed_env("+30s"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = {line["op"]: line for line in map(json.loads, out.stdout.splitlines())}
    assert set(got) == {"write", "metronome", "s3 acquire"}, got
    for op, e in got.items():
        assert e["class"] == "ClockOff", (op, e)
        assert e["retryable"] is False, (op, e)
        # The Roughtime check measured this clock 30 s ahead, past what
        # passes (the tolerance, the answer's radius and half its RTT).
        assert 29 < e["offset"] < 31, (op, e)
        assert 0.5 <= e["allowed"] < e["offset"], (op, e)


def test_a_write_into_a_bag_a_reader_closed_is_late_rejected(server, tmp_path):
    """A writer whose clock and time authority are both 30 s behind writes
    into seconds that a reader on true time has already closed: the
    directory store refuses the batch (a closed bag's files are read-only),
    and no reader sees it."""
    (tmp_path / "bags").mkdir()
    url = str(tmp_path / "bags")
    behind = Server(env=skewed_env("-30s"))
    child = subprocess.Popen(
        [PYTHON, CHILD, "late", behind.url, url, "late"],
        env=skewed_env("-30s"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(child.stdout.readline())
        assert first["class"] is None, first
        [stamp] = first["result"]
        # The writer's clock is 30 s behind: its batch is well in the past.
        assert stamp < time.time() * 1e6 - 25e6
        closer = bagel.Client(server.url, roughtime=roughtime())
        # The writer's witnesses are the skewed server's: trusted too.
        store = bagel.open_store(url, client=closer, keys=[behind.key])
        # A read on true time closes every past-due bag of the log, those
        # no one wrote to included (empty), so that later readers agree.
        read = store.read("late")
        assert [m.payload for m in read] == [b"on time"], (read.rejected, read.problems)
        child.stdin.write("go\n")
        child.stdin.flush()
        second = json.loads(child.stdout.readline())
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        behind.kill()
    assert second["class"] == "LateRejected", second
    assert second["retryable"] is False
    assert second["log"] == "late"
    # The bag refused is one the closer closed: after the first batch's,
    # and more than the grace and the closer's clock bound in the past.
    assert bag_of(stamp) <= second["bag"] < bag_of(int(time.time() * 1e6) - 3_000_000), second
    # The refused batch is in no reader's view.
    assert [m.payload for m in store.read("late")] == [b"on time"]
