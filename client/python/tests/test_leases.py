"""Leases from Python against a real bagel-server: conflict, wait, renew,
the release watermark reaching the next holder, loss, asyncio."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import pytest

import bagel


def test_a_held_name_is_refused_with_its_holder(client):
    a = client.acquire(["conflict-a", "conflict-b"], ttl=5, owner="first")
    with pytest.raises(bagel.HeldError) as refused:
        client.acquire("conflict-b", ttl=5, owner="second")
    e = refused.value
    assert e.holder == a.id
    assert e.owner == "first"
    assert e.name == "conflict-b"
    assert e.deadline == a.deadline
    assert e.retryable
    a.release()


def test_the_default_owner_is_host_colon_pid_as_the_cli_s(client):
    held = client.acquire("default-owner", ttl=5)
    with pytest.raises(bagel.HeldError) as refused:
        client.acquire("default-owner", ttl=5)
    # A conflict says who holds the name, as the CLI's default does.
    assert refused.value.owner == f"{socket.gethostname()}:{os.getpid()}"
    held.release()


def test_a_lease_not_renewed_is_lost_at_its_deadline(client):
    lease = client.acquire("unrenewed", ttl=1, auto_renew=False)
    assert lease.lost is None
    told = threading.Event()
    reasons = []
    lease.on_lost(lambda r: (reasons.append(r), told.set()))
    # Nothing renews it: its deadline passing is its loss, and every way
    # of asking says so.
    why = lease.wait_lost(timeout=20)
    assert why is not None and why.startswith("expired"), why
    assert lease.lost == why
    assert told.wait(20) and reasons == [why]
    assert lease.time_left() == 0 and not lease.is_valid()
    # A released lease is not lost, however long ago its deadline was.
    released = client.acquire("unrenewed-released", ttl=1, auto_renew=False)
    released.release()
    assert released.wait_lost(timeout=2) is None and released.lost is None


def test_a_waiting_acquire_gets_the_name_when_it_is_released(client):
    first = client.acquire("wait", ttl=5)
    got = {}
    waiter = threading.Thread(target=lambda: got.update(lease=client.acquire("wait", ttl=5, wait=20)))
    waiter.start()
    first.release()
    waiter.join()
    second = got["lease"]
    assert second.previous["wait"]["ended"] == "released"
    assert second.previous["wait"]["lease_id"] == first.id
    assert second.fencing_tokens["wait"] > first.fencing_tokens["wait"]
    second.release()


def test_renew_moves_the_deadline_and_the_lease_stays_valid(client):
    lease = client.acquire("renew", ttl=5)
    before = lease.deadline
    after = lease.renew()
    assert after >= before
    assert lease.deadline == after
    assert lease.is_valid()
    assert lease.mode == "full"
    assert lease.witnesses and all(w["signature"] for w in lease.witnesses)
    assert 0 < lease.time_left() <= 5
    lease.release()
    assert not lease.is_valid()
    with pytest.raises(bagel.Closed):
        lease.renew()


def test_a_lease_block_renews_in_the_background(client):
    with client.lease("background", ttl=2) as lease:
        first = lease.deadline
        # Past its first deadline, it is still held: renewed every third
        # of its TTL without a call from here.
        assert lease.wait_lost(timeout=3) is None
        assert lease.is_valid()
        assert lease.deadline > first


def test_the_release_watermark_reaches_the_next_holder(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    with client.lease("ledger", ttl=5) as lease:
        stamps = store.writer("ledger", lease).write([b"deposit 10", b"withdraw 3"])
        assert lease.written == stamps[-1]
    nxt = client.acquire("ledger", ttl=5)
    inherited = nxt.previous["ledger"]
    assert inherited["ended"] == "released"
    assert inherited["lease_id"] == lease.id
    assert inherited["watermark"] >= stamps[-1]
    assert nxt.min_timestamp >= inherited["watermark"]
    # A watermark given explicitly, above what was written, is published.
    wm = nxt.release(watermark=inherited["watermark"] + 1000)
    assert wm == inherited["watermark"] + 1000
    assert client.acquire("ledger", ttl=5).previous["ledger"]["watermark"] == wm


def test_a_watermark_below_what_was_written_is_refused(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    lease = client.acquire("low-watermark", ttl=5)
    stamps = store.writer("log", lease).write([b"m"])
    with pytest.raises(bagel.InvalidArgument):
        lease.release(watermark=stamps[0] - 1)


def test_an_expired_lease_is_lost_to_the_next_holder(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    old = client.acquire("expire", ttl=0.5, auto_renew=False)
    writer = store.writer("expire-log", old)
    # The next acquire waits for the deadline, then breaks the old lease.
    new = client.acquire("expire", ttl=5, wait=10)
    assert new.previous["expire"]["ended"] == "broken"
    with pytest.raises(bagel.LeaseLost):
        old.renew()
    with pytest.raises(bagel.LeaseLost):
        writer.write([b"too late"])
    new.release()


def test_on_lost_and_the_lease_block_say_so_when_the_server_is_gone(own_server):
    client = bagel.Client(own_server.url)
    told = threading.Event()
    reasons = []
    with pytest.raises(bagel.LeaseLost):
        with client.lease("lost", ttl=1, on_lost=lambda r: (reasons.append(r), told.set())) as lease:
            own_server.kill()
            assert lease.wait_lost(timeout=30) is not None
    assert told.wait(30)
    assert reasons and not lease.is_valid()


def test_tentative_then_upgrade(client):
    lease = client.acquire("tentative", ttl=5, tentative=True)
    assert lease.mode == "tentative"
    assert not lease.is_valid()
    lease.upgrade()
    assert lease.mode == "full"
    assert lease.is_valid()
    lease.release()


def test_asyncio_acquire_renew_release_and_the_async_block(client):
    async def main():
        lease = await client.acquire_async("async", ttl=5)
        other = asyncio.ensure_future(client.acquire_async("async", ttl=5, wait=20))
        assert (await lease.renew_async()) >= lease.min_timestamp
        await lease.release_async()
        second = await other
        assert second.previous["async"]["lease_id"] == lease.id
        await second.release_async()
        async with client.lease(["async-a", "async-b"], ttl=5) as held:
            assert sorted(held.names) == ["async-a", "async-b"]
        with pytest.raises(bagel.HeldError):
            async with client.lease("async-held", ttl=5):
                await client.acquire_async("async-held", ttl=5)

    asyncio.run(main())


def test_cancelling_an_async_acquire_stops_its_wait(client):
    async def main():
        holder = await client.acquire_async("cancel", ttl=5)
        waiting = asyncio.ensure_future(client.acquire_async("cancel", ttl=5, wait=None))
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert holder.is_valid()
        await holder.release_async()
        # Whether or not the server heard of the cancel before the
        # release, the name is to be had (at the latest when a grant to
        # the cancelled wait, never renewed, runs out).
        again = await client.acquire_async("cancel", ttl=5, wait=10)
        await again.release_async()

    asyncio.run(main())


def test_leases_on_an_s3_lease_store(tmp_path):
    import uuid

    from conftest import roughtime, s3_url

    client = bagel.Client(
        lease_store=s3_url(f"py-leases-{uuid.uuid4().hex}"),
        lease_key=str(tmp_path / "lease-key"),
        roughtime=roughtime(),
    )
    first = client.acquire("s3-name", ttl=5)
    with pytest.raises(bagel.HeldError) as held:
        client.acquire("s3-name", ttl=5)
    assert held.value.holder == first.id
    wm = first.release(watermark=first.min_timestamp + 1)
    second = client.acquire("s3-name", ttl=5)
    assert second.previous["s3-name"]["ended"] == "released"
    assert second.previous["s3-name"]["watermark"] == wm
    assert second.fencing_tokens["s3-name"] > first.fencing_tokens["s3-name"]
    second.release()
    with pytest.raises(bagel.InvalidArgument):
        bagel.Client(lease_store=s3_url("x"), lease_key=str(tmp_path / "k"))
