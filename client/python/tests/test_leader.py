"""Leader election from Python: failover between two processes, and a
leader whose lease is lost getting LeaseLost (sync and asyncio)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

import bagel
from conftest import PYTHON

CHILD = str(Path(__file__).with_name("leader_child.py"))


def leader(server_url: str, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, CHILD, server_url, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_leadership_fails_over_between_two_processes(server):
    first = leader(server.url, "leader-failover")
    led = json.loads(first.stdout.readline())
    second = leader(server.url, "leader-failover")
    # The second waits while the first leads; it leads once the first is
    # killed (no release: its lease runs out).
    first.kill()
    first.wait()
    took = json.loads(second.stdout.readline())
    assert took["token"] > led["token"]
    assert took["previous"]["ended"] == "broken"
    # Closing its input ends its block: it steps down and releases.
    second.stdin.close()
    assert second.stdout.readline().strip() == "stepped down"
    assert second.wait(timeout=60) == 0
    client = bagel.Client(server.url)
    after = client.acquire("leader-failover", ttl=5)
    assert after.previous["leader-failover"]["ended"] == "released"
    after.release()


def test_a_leader_that_loses_its_lease_gets_lease_lost(own_server):
    client = bagel.Client(own_server.url)
    with pytest.raises(bagel.LeaseLost) as lost:
        with client.leader("leader-lost", ttl=1) as lease:
            own_server.kill()
            # Blocks in Rust until lost; the LeaseLost raised into this
            # thread lands at the next Python instruction.
            lease.wait_lost(timeout=30)
            while True:
                pass
    assert "leader-lost" in str(lost.value)


def test_an_async_leader_that_loses_its_lease_gets_lease_lost(own_server):
    client = bagel.Client(own_server.url)

    async def lead():
        async with client.leader("leader-async", ttl=1):
            own_server.kill()
            await asyncio.Event().wait()

    with pytest.raises(bagel.LeaseLost):
        asyncio.run(lead())


def test_a_leader_block_that_ends_releases(server):
    client = bagel.Client(server.url)
    with client.leader("leader-ends", wait=10, ttl=5) as lease:
        token = lease.fencing_tokens["leader-ends"]
    nxt = client.acquire("leader-ends", ttl=5)
    assert nxt.previous["leader-ends"]["ended"] == "released"
    assert nxt.fencing_tokens["leader-ends"] > token
    nxt.release()
