"""A server list found in DNS (`dns+srv://NAME`) from Python: the same
parsing and routing as the Rust library and the CLI (the package opens
every backend through bagel_cli), against a real dnsmasq on 127.0.0.1 and
two servers started with --members."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

import bagel

from conftest import Server

SRV = "_bagel._tcp.bagel.test"


def dnsmasq() -> str:
    found = shutil.which("dnsmasq") or next(
        (p for p in ("/usr/sbin/dnsmasq", "/sbin/dnsmasq") if Path(p).exists()), None
    )
    assert found, "dnsmasq not found: tests/run.sh installs it (apt-get install dnsmasq-base)"
    return found


@pytest.fixture
def members():
    ids = ["bagel-0", "bagel-1"]
    servers = [Server("--server-id", i, "--members", ",".join(ids)) for i in ids]
    yield list(zip(ids, servers))
    for s in servers:
        s.kill()


@pytest.fixture
def dns(members, tmp_path, monkeypatch):
    """dnsmasq answering SRV records for the members, named by
    BAGEL_DNS_SERVER (read by the client library in this process)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines = [
        f"port={port}",
        "listen-address=127.0.0.1",
        "bind-interfaces",
        "no-resolv",
        "no-hosts",
        "local=/bagel.test/",
    ]
    for member, server in members:
        host = f"{member}.bagel.test"
        lines.append(f"srv-host={SRV},{host},{server.url.rsplit(':', 1)[1]}")
        lines.append(f"host-record={host},127.0.0.1")
    conf = tmp_path / "dnsmasq.conf"
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [dnsmasq(), "--keep-in-foreground", f"--conf-file={conf}", "--log-facility=-", "--pid-file="],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # dnsmasq logs "started" once its sockets are bound.
    for line in proc.stderr:
        if "started, version" in line:
            break
    else:
        raise AssertionError("dnsmasq did not start")
    monkeypatch.setenv("BAGEL_DNS_SERVER", f"127.0.0.1:{port}")
    yield f"dns+srv://{SRV}"
    proc.kill()
    proc.wait()


def test_a_dns_list_routes_as_the_members_announce(dns):
    first = bagel.Client(dns)
    second = bagel.Client(dns)
    names = [f"py-dns-{i}" for i in range(8)]
    held = [first.acquire(n, ttl=10) for n in names]
    for n in names:
        with pytest.raises(bagel.HeldError):
            second.acquire(n, ttl=10)
    for lease in held:
        lease.release()


def test_a_dns_list_without_records_is_refused(dns, monkeypatch):
    with pytest.raises(bagel.BagelError) as refused:
        bagel.Client("dns+srv://_none._tcp.bagel.test")
    assert "dns+srv://_none._tcp.bagel.test" in str(refused.value)
