"""Bags from Python: write -> metronome -> read -> audit on a directory and
on S3, summaries, and one log shared with the Rust CLI both ways."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

import bagel
import bagel.errors
from conftest import cli, s3_url


def write_close_read_audit(client, url: str) -> None:
    store = bagel.open_store(url, client=client)
    log = "orders"
    with client.lease("orders-writer", ttl=5) as lease:
        writer = store.writer(log, lease, writer_id="py-1")
        first = writer.write([b"a", b"b"])
        second = writer.write([b"c"])
    stamps = first + second
    assert stamps == sorted(stamps) and len(set(stamps)) == 3
    assert all(t > lease.min_timestamp for t in stamps)
    with store.metronome(log, max_idle_listing=0) as metronome:
        assert metronome.wait_closed(log, stamps[-1], timeout=60)
    messages = store.read(log)
    got = list(messages)
    assert [m.payload for m in got] == [b"a", b"b", b"c"]
    assert [m.timestamp for m in got] == stamps
    assert all(m.verified and m.writer == "py-1" and m.lease_ids == [lease.id] for m in got)
    assert [m.sequence for m in got] == sorted(m.sequence for m in got)
    assert messages.verified and not messages.rejected and not messages.problems
    # A range: only the first batch.
    assert [m.payload for m in store.read(log, end=first[-1] + 1)] == [b"a", b"b"]
    report = store.audit(log)
    assert report.clean, report.violations
    assert report.messages == 3 and report.leases == 1 and report.names == 1


def test_write_metronome_read_audit_on_a_directory(client, tmp_path):
    write_close_read_audit(client, str(tmp_path))


def test_write_metronome_read_audit_on_s3(client):
    write_close_read_audit(client, s3_url(f"py-{uuid.uuid4().hex}"))


def test_the_exceptions_form_one_hierarchy():
    for name in bagel.errors.__all__:
        assert issubclass(getattr(bagel, name), bagel.BagelError), name
    assert issubclass(bagel.InvalidArgument, ValueError)
    assert issubclass(bagel.Closed, ValueError)
    assert issubclass(bagel.LogNotFound, LookupError) and issubclass(bagel.LogNotFound, bagel.InvalidArgument)
    assert issubclass(bagel.Unavailable, ConnectionError)
    assert bagel.Unavailable.retryable and not bagel.LateRejected.retryable


def bag_of(timestamp: int) -> str:
    """The bag (second) of a timestamp, in the form of `Message.bag`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp // 1_000_000))


def test_a_read_right_after_a_write_names_the_open_bag_it_skipped(client, tmp_path):
    # A long grace: the bag is still open when it is read, however slow
    # this machine.
    store = bagel.open_store(str(tmp_path), client=client, grace=60)
    with client.lease("fresh", ttl=5) as lease:
        stamps = store.writer("fresh", lease).write([b"just now"])
    messages = store.read("fresh")
    assert list(messages) == []
    # Everything read checked; what was not read is named.
    assert messages.verified
    assert messages.open_bags_skipped == [bag_of(stamps[0])]
    assert messages.close_refused is None
    assert "open_bags_skipped=1" in repr(messages)
    with_open = store.read("fresh", include_open=True)
    assert [m.payload for m in with_open] == [b"just now"]
    assert with_open.open_bags_skipped == []


def test_reading_a_log_nobody_wrote_raises_log_not_found(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    with pytest.raises(bagel.LogNotFound) as missing:
        store.read("never-written")
    e = missing.value
    assert e.log == "never-written" and str(tmp_path) in e.store
    assert "never-written" in str(e) and not e.retryable
    # A lookup that failed, and (as before) a bad argument.
    assert isinstance(e, LookupError) and isinstance(e, bagel.InvalidArgument)

    async def read_async():
        return await store.read_async("never-written")

    with pytest.raises(bagel.LogNotFound):
        asyncio.run(read_async())
    with pytest.raises(bagel.LogNotFound):
        store.summarize("never-written")
    # An empty range of a log that exists is no error.
    with client.lease("exists", ttl=5) as lease:
        stamps = store.writer("exists", lease).write([b"x"])
    assert list(store.read("exists", end=stamps[0])) == []


def test_without_a_client_a_read_is_unverified_and_closes_nothing(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    with client.lease("unverified", ttl=5) as lease:
        stamps = store.writer("u", lease).write([b"x"])
    with store.metronome("u", max_idle_listing=0) as m:
        assert m.wait_closed("u", stamps[-1])
    plain = bagel.open_store(str(tmp_path))
    messages = plain.read("u")
    got = list(messages)
    assert [m.payload for m in got] == [b"x"]
    assert not got[0].verified and not messages.verified
    # With the server's keys given, the same read verifies.
    keyed = bagel.open_store(str(tmp_path), keys=client.trusted_keys())
    assert all(m.verified for m in keyed.read("u"))
    assert keyed.audit("u").clean


def test_summaries_are_made_and_read(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    with client.lease("summary", ttl=5) as lease:
        stamps = store.writer("s", lease).write([b"one", b"two"])
    # A stretch of one minute is summarized once its minute has closed.
    with store.metronome("s", max_idle_listing=0) as m:
        minute_end = (stamps[-1] // 60_000_000 + 1) * 60_000_000
        assert m.wait_closed("s", minute_end - 1, timeout=120)
    made = store.summarize("s")
    assert len(made) == 1
    assert store.summarize("s") == []
    assert [m.payload for m in store.read("s")] == [b"one", b"two"]
    assert store.audit("s").clean
    with pytest.raises(bagel.InvalidArgument):
        store.retain("s", keep_bags=1)
    assert store.retain("s", keep_bags=600)["bags_removed"] == 0


def test_a_python_writer_and_a_rust_reader(server, client, tmp_path):
    (tmp_path / "bags").mkdir()
    url = f"file://{tmp_path / 'bags'}"
    store = bagel.open_store(url, client=client)
    with client.lease("py-to-rust", ttl=5) as lease:
        stamps = store.writer("shared", lease, writer_id="python").write([b"from python 1", b"from python 2"])
    with store.metronome("shared", max_idle_listing=0) as m:
        assert m.wait_closed("shared", stamps[-1])
    out = cli(server, "read", "--store", url, "--log", "shared", "--key", server.key, "--json", state=tmp_path)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    messages = [line for line in lines if line["kind"] == "message"]
    assert [m["payload"] for m in messages] == ["from python 1", "from python 2"]
    assert [m["timestamp_us"] for m in messages] == stamps
    assert all(m["verified"] and m["writer_id"] == "python" for m in messages)


def test_a_rust_writer_and_a_python_reader(server, client, tmp_path):
    (tmp_path / "bags").mkdir()
    url = f"file://{tmp_path / 'bags'}"
    lease_file = tmp_path / "lease.json"
    acquired = cli(server, "acquire", "rust-to-py", "--ttl", "10s", "--json", state=tmp_path)
    lease_file.write_text(acquired.stdout)
    wrote = cli(
        server, "write", "--store", url, "--log", "shared", "--lease", str(lease_file),
        "--writer-id", "rust", "from rust 1", "from rust 2", state=tmp_path,
    )
    stamps = [int(line.split()[0]) for line in wrote.stdout.splitlines()]
    cli(server, "release", "--lease", str(lease_file), state=tmp_path)
    store = bagel.open_store(url, client=client)
    with store.metronome("shared", max_idle_listing=0) as m:
        assert m.wait_closed("shared", stamps[-1])
    got = list(store.read("shared"))
    assert [m.payload for m in got] == [b"from rust 1", b"from rust 2"]
    assert [m.timestamp for m in got] == stamps
    assert all(m.verified and m.writer == "rust" for m in got)
    assert store.audit("shared").clean
    # The Python holder that comes next inherits what the CLI published.
    nxt = client.acquire("rust-to-py", ttl=5)
    assert nxt.previous["rust-to-py"]["watermark"] >= stamps[-1]
    nxt.release()


def test_asyncio_write_and_audit(client, tmp_path):
    import asyncio

    store = bagel.open_store(str(tmp_path), client=client)

    async def main():
        async with client.lease("async-bags", ttl=5) as lease:
            writer = store.writer("a", lease)
            stamps = await asyncio.gather(writer.write_async([b"1"]), writer.write_async([b"2"]))
        return sorted(t for batch in stamps for t in batch)

    stamps = asyncio.run(main())
    with store.metronome("a", max_idle_listing=0) as m:
        assert m.wait_closed("a", stamps[-1])

    async def read_and_audit():
        return await store.read_async("a"), await store.audit_async("a")

    messages, report = asyncio.run(read_and_audit())
    assert sorted(m.payload for m in messages) == [b"1", b"2"]
    assert report.clean and report.messages == 2
