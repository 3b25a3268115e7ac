"""bagel for Python: leases on named domains with absolute deadlines,
fencing tokens and watermarks; leader election; and closable per-second
bags of timestamped messages on a directory or S3.

Quick start::

    import bagel, tempfile

    client = bagel.Client("http://127.0.0.1:7420")
    store = bagel.open_store(tempfile.mkdtemp(), client=client)
    with client.lease(["ledger"], ttl=5) as lease:
        stamps = store.writer("ledger", lease).write([b"deposit 10"])
    with store.metronome("ledger") as m:
        m.wait_closed("ledger", stamps[-1])
    for message in store.read("ledger"):
        print(message.timestamp, message.payload, message.verified)

Instants are microseconds since the Unix epoch (int); durations are
seconds (float). Every blocking call releases the GIL; every call that
waits has an ``*_async`` form (or ``async with``) for asyncio. Both run on
one runtime the module owns, stopped at interpreter exit.

Leader election in Python cannot fence: there is no process tree to kill.
When ``with client.leader(...)`` loses its lease, the block gets
``LeaseLost`` (raised in the thread that entered it, at its next Python
instruction, or at the latest when the block ends) and the application
must stop acting as leader. A thread blocked in a call that does not
return to Python is not interrupted. Guard what the leader writes with
its fencing token (``lease.fencing_tokens``): a store that refuses a
token lower than one it has seen refuses a deposed leader too.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import threading
from typing import Callable, Iterable, Optional, Union

from . import _bagel
from ._bagel import AuditReport, Lease, Message, Messages, Metronome, Store, Writer, open_store
from .errors import (
    BagelError,
    ClockOff,
    Closed,
    HeldError,
    InvalidArgument,
    LateRejected,
    LeaseLost,
    LogNotFound,
    Unavailable,
)

__version__: str = _bagel.__version__
"""The package's version: bagel's, the crates' and the binaries' alike."""

__all__ = [
    "__version__",
    "Client",
    "Lease",
    "Store",
    "Writer",
    "Message",
    "Messages",
    "AuditReport",
    "Metronome",
    "open_store",
    "BagelError",
    "InvalidArgument",
    "LogNotFound",
    "Closed",
    "HeldError",
    "LeaseLost",
    "LateRejected",
    "ClockOff",
    "Unavailable",
]

Names = Union[str, Iterable[str]]


class Client(_bagel.Client):
    """A connection to where leases live.

    ``servers``: one lease server URL (``http://host:port``, or
    ``https://...`` with ``ca``), several comma-separated or as a list
    (names are routed by rendezvous hashing); default
    ``http://127.0.0.1:7420``. ``ca``, ``cert``, ``cert_key``: PEM files for
    TLS and mutual TLS. ``lease_store="s3://bucket/prefix"`` keeps leases
    on S3 conditional writes instead (endpoint and credentials from the
    ``AWS_*`` environment), with ``lease_key`` (the file of this client's
    ed25519 key, created if missing) and ``roughtime``. ``roughtime``:
    ``[("host:port", "public key"), ...]``, signed time for writers and
    closers; without it signed time comes from the first lease server.
    ``timeout``: seconds for each call. Raises ``Unavailable`` when the
    servers cannot be reached.

    Besides ``acquire`` (and ``acquire_async``), it makes the context
    managers ``lease`` and ``leader``.
    """

    def lease(
        self,
        names: Names,
        *,
        ttl: float = 10.0,
        wait: Optional[float] = 0.0,
        tentative: bool = False,
        owner: Optional[str] = None,
        on_lost: Optional[Callable[[str], None]] = None,
    ) -> "_LeaseBlock":
        """``with client.lease(["a", "b"], ttl=5) as lease:`` acquires on
        entry (``async with`` too), renews in the background, and
        releases on exit, publishing what writers under it wrote as the
        watermark the next holder inherits. If the lease was lost and the
        block raised nothing, the exit raises ``LeaseLost``.
        ``on_lost(reason)`` is called from a bagel thread when it is
        lost."""
        return _LeaseBlock(self, names, ttl, wait, tentative, owner, on_lost)

    def leader(self, name: str, *, wait: Optional[float] = None, ttl: float = 10.0,
               owner: Optional[str] = None) -> "_LeaderBlock":
        """``with client.leader("name") as lease:`` waits to become the
        leader (for ``wait`` seconds; ``None``: as long as it takes), and
        leads until the block ends. On loss of the lease the block gets
        ``LeaseLost`` (see the module docs: the application must stop).
        ``async with client.leader(...)`` cancels the task that entered
        the block instead, and the exit raises ``LeaseLost``."""
        return _LeaderBlock(self, name, ttl, wait, owner)


def _release_on_exit(lease: Lease, failed: bool) -> None:
    lost = lease.lost
    if lost is not None:
        # Lost: the release can only fail (the lease is gone, or the server
        # that lost it is down); what the block must hear is the loss.
        try:
            lease.release()
        except BagelError:
            pass
        if not failed:
            raise LeaseLost(f"lease {lease.id} was lost: {lost}")
        return
    try:
        lease.release()
    except Closed:
        # Released inside the block already.
        pass
    except BagelError:
        # The block's own exception says more than a failed release.
        if not failed:
            raise


async def _release_on_exit_async(lease: Lease, failed: bool) -> None:
    lost = lease.lost
    if lost is not None:
        # Lost: the release can only fail (the lease is gone, or the server
        # that lost it is down); what the block must hear is the loss.
        try:
            await lease.release_async()
        except BagelError:
            pass
        if not failed:
            raise LeaseLost(f"lease {lease.id} was lost: {lost}")
        return
    try:
        await lease.release_async()
    except Closed:
        # Released inside the block already.
        pass
    except BagelError:
        # The block's own exception says more than a failed release.
        if not failed:
            raise


class _LeaseBlock:
    def __init__(self, client, names, ttl, wait, tentative, owner, on_lost):
        self._client = client
        self._args = dict(ttl=ttl, wait=wait, tentative=tentative, owner=owner)
        self._names = names
        self._on_lost = on_lost
        self._lease: Optional[Lease] = None

    def _held(self, lease: Lease) -> Lease:
        self._lease = lease
        if self._on_lost is not None:
            lease.on_lost(self._on_lost)
        return lease

    def __enter__(self) -> Lease:
        return self._held(self._client.acquire(self._names, **self._args))

    def __exit__(self, typ, exc, tb) -> None:
        _release_on_exit(self._lease, typ is not None)

    async def __aenter__(self) -> Lease:
        return self._held(await self._client.acquire_async(self._names, **self._args))

    async def __aexit__(self, typ, exc, tb) -> None:
        await _release_on_exit_async(self._lease, typ is not None)


def _raise_in_thread(thread_id: int) -> None:
    """Raises ``LeaseLost`` in another thread at its next Python
    instruction (CPython's PyThreadState_SetAsyncExc)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(LeaseLost))


class _LeaderBlock:
    def __init__(self, client, name, ttl, wait, owner):
        self._client = client
        self._name = name
        self._args = dict(ttl=ttl, wait=wait, owner=owner)
        self._lease: Optional[Lease] = None
        self._guard = threading.Lock()
        self._inside = False
        self._reason: Optional[str] = None

    def __enter__(self) -> Lease:
        self._lease = self._client.acquire([self._name], **self._args)
        thread = threading.get_ident()
        self._inside = True

        def lost(reason: str) -> None:
            with self._guard:
                self._reason = reason
                if self._inside:
                    _raise_in_thread(thread)

        self._lease.on_lost(lost)
        return self._lease

    def __exit__(self, typ, exc, tb) -> None:
        with self._guard:
            self._inside = False
        if typ is LeaseLost and not (exc and exc.args):
            # The bare exception raised into the block: say what was lost.
            lease = self._lease
            try:
                lease.release()
            except BagelError:
                pass
            raise LeaseLost(f"leadership of {self._name!r} lost: {self._reason or lease.lost}") from None
        _release_on_exit(self._lease, typ is not None)

    async def __aenter__(self) -> Lease:
        self._lease = await self._client.acquire_async([self._name], **self._args)
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        self._inside = True

        def cancel() -> None:
            if self._inside and task is not None:
                task.cancel()

        self._lease.on_lost(lambda reason: loop.call_soon_threadsafe(cancel))
        return self._lease

    async def __aexit__(self, typ, exc, tb) -> None:
        self._inside = False
        lease = self._lease
        lost = lease.lost
        if lost is not None:
            try:
                await lease.release_async()
            except BagelError:
                pass
            raise LeaseLost(f"leadership of {self._name!r} lost: {lost}") from exc
        await _release_on_exit_async(lease, typ is not None)


atexit.register(_bagel._shutdown)
