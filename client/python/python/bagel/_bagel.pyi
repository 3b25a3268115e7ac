"""Type stubs of the native module ``bagel._bagel``.

Instants are microseconds since the Unix epoch (int); durations are
seconds (float).
"""

from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

Names = Union[str, Sequence[str]]

__version__: str

class Client:
    """A connection to where leases live.

    ``servers``: one lease server URL (``http://host:port``, or
    ``https://...`` with ``ca``), several comma-separated or as a list
    (names are routed by rendezvous hashing); default
    ``http://127.0.0.1:7420``. ``ca``, ``cert``, ``cert_key``: PEM files for
    TLS and mutual TLS. ``lease_store="s3://bucket/prefix"`` keeps leases on
    S3 conditional writes instead (``AWS_*`` environment), with
    ``lease_key`` (the file of this client's signing key, created if
    missing) and ``roughtime``. ``roughtime``: ``[("host:port",
    "public key"), ...]``, signed time for writers and closers; without it
    signed time comes from the first lease server. ``timeout``: seconds
    for each call.

    Raises ``Unavailable`` when the servers cannot be reached.
    """

    def __init__(
        self,
        servers: Optional[Names] = None,
        *,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        cert_key: Optional[str] = None,
        lease_store: Optional[str] = None,
        lease_key: Optional[str] = None,
        roughtime: Optional[Sequence[Tuple[str, str]]] = None,
        timeout: Optional[float] = None,
    ) -> None: ...
    def acquire(
        self,
        names: Names,
        *,
        ttl: float = 10.0,
        wait: Optional[float] = 0.0,
        tentative: bool = False,
        owner: Optional[str] = None,
        auto_renew: bool = True,
    ) -> Lease:
        """Acquires a lease on ``names`` (all or none) for ``ttl`` seconds.
        ``wait``: seconds to wait for busy names (``None``: as long as it
        takes; 0: raise ``HeldError`` at once)."""
    def acquire_async(
        self,
        names: Names,
        *,
        ttl: float = 10.0,
        wait: Optional[float] = 0.0,
        tentative: bool = False,
        owner: Optional[str] = None,
        auto_renew: bool = True,
    ) -> Awaitable[Lease]:
        """``acquire``, awaitable."""
    def trusted_keys(self) -> List[str]:
        """The public keys (hex) that verify this backend's witnesses."""

class Lease:
    """A held lease, renewed in the background until released or lost."""

    @property
    def id(self) -> str: ...
    @property
    def names(self) -> List[str]: ...
    @property
    def fencing_tokens(self) -> Dict[str, int]:
        """Each name's fencing token, strictly increasing per name: the
        store-side guard against a holder that lost its lease."""
    @property
    def previous(self) -> Dict[str, Dict[str, Any]]:
        """Per name, what it inherited: ``lease_id``, ``watermark`` (µs),
        ``ended`` (``none``, ``released``, ``broken``, ``unknown``)."""
    @property
    def min_timestamp(self) -> int:
        """Every message written under this lease is strictly later (µs)."""
    @property
    def deadline(self) -> int:
        """The deadline of the latest grant or renewal (µs)."""
    @property
    def mode(self) -> str:
        """``full`` or ``tentative``."""
    @property
    def witnesses(self) -> List[Dict[str, Any]]:
        """The signed witnesses of the latest grant or renewal:
        ``key_id``, ``body``, ``signature``."""
    @property
    def lost(self) -> Optional[str]:
        """Why the lease was lost (its deadline passing with no renewal
        included: ``"expired: ..."``), or ``None``."""
    @property
    def written(self) -> Optional[int]:
        """The highest timestamp written under the lease (µs), or ``None``."""
    def is_valid(self) -> bool:
        """Not lost, not released, full, and over 0.5 s before its deadline."""
    def time_left(self) -> float:
        """Seconds the lease still counts as held."""
    def renew(self) -> int:
        """Renews now; returns the new deadline. Raises ``LeaseLost``."""
    def renew_async(self) -> Awaitable[int]: ...
    def upgrade(self) -> None:
        """Turns a tentative lease full."""
    def upgrade_async(self) -> Awaitable[None]: ...
    def release(self, watermark: Optional[int] = None) -> int:
        """Releases, publishing at least the highest timestamp written
        under the lease (or ``watermark`` if higher); returns it."""
    def release_async(self, watermark: Optional[int] = None) -> Awaitable[int]: ...
    def on_lost(self, callback: Callable[[str], Any]) -> None:
        """Calls ``callback(reason)`` from a bagel thread when the lease is
        lost."""
    def wait_lost(self, timeout: Optional[float] = None) -> Optional[str]:
        """Blocks until lost (returns why; an expired deadline counts),
        released or ``timeout`` (returns ``None``)."""

class Writer:
    """Writes batches to one log under one lease."""

    @property
    def max_written(self) -> Optional[int]: ...
    @property
    def writer_id(self) -> str: ...
    def write(self, messages: Sequence[bytes]) -> List[int]:
        """Stores one batch; returns each message's timestamp (µs)."""
    def write_async(self, messages: Sequence[bytes]) -> Awaitable[List[int]]: ...

class Message:
    """One message read."""

    timestamp: int
    writer: str
    sequence: int
    payload: bytes
    lease_ids: List[str]
    verified: bool
    bag: str

class Messages(Iterator[Message]):
    """The messages of a read, in timestamp order; ``open_bags_skipped``
    names the bags still open and so not read."""

    rejected: List[str]
    problems: List[str]
    verified: bool
    closed_bags_read: int
    count: int
    open_bags_skipped: List[str]
    close_refused: Optional[str]
    def __iter__(self) -> "Messages": ...
    def __next__(self) -> Message: ...
    def __len__(self) -> int: ...

class AuditReport:
    """What an audit found."""

    messages: int
    leases: int
    names: int
    longest_chain: int
    chain_gaps: int
    unbound_messages: int
    violations: List[str]
    unchecked_summaries: List[str]
    @property
    def clean(self) -> bool: ...

class Metronome:
    """Closes its logs' bags at every close time, in the background."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def wait_closed(self, log: str, timestamp: int, *, timeout: float = 30.0) -> bool:
        """Blocks until every bag of ``log`` up to ``timestamp`` is closed."""
    def tick(self) -> int:
        """One round now; returns how many bags it closed."""
    def __enter__(self) -> "Metronome": ...
    def __exit__(self, *exc: Any) -> None: ...

class Store:
    """A bag store: a directory, ``s3://bucket/prefix`` or ``nfs://...``."""

    def writer(self, log: str, lease: Lease, *, writer_id: Optional[str] = None) -> Writer: ...
    def read(
        self,
        log: str,
        *,
        start: Optional[int] = None,
        end: Optional[int] = None,
        trust_summarizer: Optional[Sequence[str]] = None,
        include_open: bool = False,
    ) -> Messages: ...
    def read_async(
        self,
        log: str,
        *,
        start: Optional[int] = None,
        end: Optional[int] = None,
        trust_summarizer: Optional[Sequence[str]] = None,
        include_open: bool = False,
    ) -> Awaitable[Messages]: ...
    def audit(self, log: str, *, start: Optional[int] = None, end: Optional[int] = None) -> AuditReport: ...
    def audit_async(
        self, log: str, *, start: Optional[int] = None, end: Optional[int] = None
    ) -> Awaitable[AuditReport]: ...
    def metronome(self, logs: Names, *, max_idle_listing: Optional[float] = None) -> Metronome: ...
    def summarize(self, log: str, *, minutes: int = 1) -> List[str]: ...
    def retain(self, log: str, *, keep_bags: float, keep_summaries: Optional[float] = None) -> Dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Store": ...
    def __exit__(self, *exc: Any) -> None: ...

def open_store(
    url: str,
    *,
    client: Optional[Client] = None,
    keys: Optional[Sequence[str]] = None,
    grace: Optional[float] = None,
) -> Store:
    """Opens the bag store at ``url`` (a directory path, ``file:///dir``,
    ``s3://bucket/prefix``, ``nfs://host/export/dir``). With ``client``,
    reads and audits verify with its keys and bags close on its signed
    time."""

def _shutdown() -> None: ...
