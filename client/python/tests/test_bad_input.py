"""Bad input gets the mirrored exceptions: wrong types, bad values, an
expired or released lease, a closed store, a server that is down."""

from __future__ import annotations

import socket

import pytest

import bagel


def test_wrong_types_are_type_errors(client, tmp_path):
    with pytest.raises(TypeError):
        client.acquire(123)
    with pytest.raises(TypeError):
        client.acquire("x", ttl="five")
    store = bagel.open_store(str(tmp_path), client=client)
    lease = client.acquire("types", ttl=5)
    with pytest.raises(TypeError):
        store.writer("log", "not a lease")
    with pytest.raises(TypeError):
        store.writer("log", lease).write([1, 2])
    lease.release()


def test_bad_values_are_invalid_arguments(client, tmp_path):
    with pytest.raises(bagel.InvalidArgument):
        client.acquire([], ttl=5)
    with pytest.raises(bagel.InvalidArgument):
        client.acquire("x", ttl=-1)
    with pytest.raises(ValueError):
        client.acquire("x", ttl=3600)
    store = bagel.open_store(str(tmp_path), client=client)
    lease = client.acquire("values", ttl=5)
    with pytest.raises(bagel.InvalidArgument):
        store.writer("../escape", lease)
    with pytest.raises(bagel.InvalidArgument):
        bagel.open_store(str(tmp_path), keys=["not hex"])
    with pytest.raises(bagel.InvalidArgument):
        bagel.open_store(str(tmp_path)).audit("log")
    lease.release()


def test_a_closed_store_refuses(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    store.close()
    lease = client.acquire("closed", ttl=5)
    with pytest.raises(bagel.Closed):
        store.writer("log", lease)
    with pytest.raises(bagel.Closed):
        store.read("log")
    lease.release()
    with bagel.open_store(str(tmp_path)) as s:
        pass
    with pytest.raises(bagel.Closed):
        s.read("log")


def test_a_released_lease_cannot_write_or_release_again(client, tmp_path):
    store = bagel.open_store(str(tmp_path), client=client)
    lease = client.acquire("released", ttl=5)
    writer = store.writer("log", lease)
    lease.release()
    with pytest.raises(bagel.LeaseLost):
        writer.write([b"after release"])
    with pytest.raises(bagel.Closed):
        lease.release()


def test_a_server_that_is_down_is_unavailable(own_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(bagel.Unavailable) as e:
        bagel.Client(f"http://127.0.0.1:{port}")
    assert e.value.retryable
    client = bagel.Client(own_server.url)
    own_server.kill()
    with pytest.raises(bagel.Unavailable):
        client.acquire("down", ttl=5)
    # The base class catches every one of them.
    with pytest.raises(bagel.BagelError):
        client.acquire("down", ttl=5)
