"""The exceptions bagel raises: the domain errors of the Rust crates.

Every exception has ``retryable``: whether the same call may succeed later.
"""

from __future__ import annotations

from typing import Optional


class BagelError(Exception):
    """Any bagel failure; the base of every class below. A failure no
    narrower class names (a new kind of error in a newer bagel) is raised
    as this, with its message."""

    retryable: bool = False


class InvalidArgument(BagelError, ValueError):
    """A value given is malformed or out of range (the message names it).
    Retrying the same call will not help."""


class LogNotFound(InvalidArgument, LookupError):
    """The log does not exist in the store: nothing was ever written or
    closed there (a mistyped log name, or the wrong store), as ``bagel
    read`` says. An empty log that was written to is no error.

    ``log``: the log asked for; ``store``: the store's URL."""

    log: Optional[str] = None
    store: Optional[str] = None


class Closed(BagelError, ValueError):
    """The object was closed: a store after ``close()``, a lease after its
    release, anything after the interpreter began to exit."""


class HeldError(BagelError):
    """A name is held by another lease.

    ``name``: the name; ``holder``: the holder's lease id; ``owner``: who
    holds it; ``mode``: ``full`` or ``tentative``; ``deadline``: when the
    holder's lease ends unless renewed (µs since the epoch): retry then,
    or acquire with ``wait=``."""

    name: Optional[str] = None
    holder: Optional[str] = None
    owner: Optional[str] = None
    mode: Optional[str] = None
    deadline: Optional[int] = None


class LeaseLost(BagelError):
    """The lease is no longer held (its deadline passed, another holder
    broke it, it was refused a renewal), or it no longer gives the right to
    write. Stop acting as its holder: in Python nothing fences the process
    for you. ``reason`` (when the server said): ``expired``, ``unknown``,
    ``released``, ..."""

    reason: Optional[str] = None


class LateRejected(BagelError):
    """A closer closed the bag before the batch landed in it: the batch is
    in no reader's view and was not acknowledged. Write it again (it gets
    a new, later timestamp).

    ``log``: the log written to; ``bag``: the closed bag's second, as
    ``YYYY-MM-DDThh:mm:ssZ`` (the form of ``Message.bag``)."""

    log: Optional[str] = None
    bag: Optional[str] = None


class ClockOff(BagelError):
    """This host's clock is further from signed time than the tolerance
    allows, or cannot be vouched for: nothing is timestamped or closed on
    it. Fix the clock; retrying will not help until then.

    ``offset``: seconds this clock is ahead of signed time (negative:
    behind), and ``allowed``: the most that passes (the tolerance plus the
    answer's radius and half its round trip), as the clock check measured
    them; ``None`` each when the refusal rests on something else (a
    grant's deadline already past on this clock: the message says how far
    ahead of the server this clock is)."""

    offset: Optional[float] = None
    allowed: Optional[float] = None


class Unavailable(BagelError, ConnectionError):
    """The lease server, the time authority or the store cannot serve now
    (down, restarting, a timeout). ``retry_after``: seconds until it
    expects to, when it said; else ``None``. Also a ``ConnectionError``
    (so an ``OSError``), as code that retries on network failures
    expects."""

    retryable = True
    retry_after: Optional[float] = None


__all__ = [
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
