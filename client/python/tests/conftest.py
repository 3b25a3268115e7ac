"""Fixtures: a real bagel-server per test module (or per test, for tests
that kill it), the binaries of the workspace's target directory, and the
S3 (moto) and Roughtime services tests/run.sh starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

import pytest

import bagel

REPO = Path(__file__).resolve().parents[3]


def binary(name: str) -> str:
    """A workspace binary: $BAGEL_BIN_DIR, else target/debug."""
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    path = Path(os.environ.get("BAGEL_BIN_DIR", os.path.join(target, "debug"))) / name
    assert path.exists(), f"{path} is not built: cargo build --bins first"
    return str(path)


class Server:
    """A bagel-server on a free port of 127.0.0.1, granting at once."""

    def __init__(self, *args: str, env: Optional[dict] = None) -> None:
        self.proc = subprocess.Popen(
            [binary("bagel-server"), "--listen", "127.0.0.1:0", "--unsafe-skip-restart-wait", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.url = ""
        self.key = ""
        # Its start-up lines say its key and address; readline waits for each.
        for line in self.proc.stdout:
            key = re.match(r"public key ([0-9a-f]{64})", line)
            if key:
                self.key = key.group(1)
            addr = re.search(r" listening on ([0-9.:]+),", line)
            if addr:
                self.url = f"http://{addr.group(1)}"
                break
        assert self.url, "bagel-server did not say where it listens"
        # Drain what else it prints, so a full pipe never stalls it.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.kill()


@pytest.fixture
def own_server():
    """A server of the test's own, for tests that kill it."""
    s = Server()
    yield s
    s.kill()


@pytest.fixture
def client(server):
    return bagel.Client(server.url)


def cli(server: Server, *args: str, state: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the `bagel` CLI against `server`."""
    out = subprocess.run(
        [binary("bagel"), "--server", server.url, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "BAGEL_STATE_DIR": str(state)},
        timeout=120,
    )
    if check:
        assert out.returncode == 0, f"bagel {args}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def s3_url(prefix: str) -> str:
    """An S3 prefix on the moto server tests/run.sh starts (AWS_* set)."""
    bucket = os.environ.get("BAGEL_S3_BUCKET")
    assert bucket and os.environ.get("AWS_ENDPOINT"), "no S3 service: run under tests/run.sh"
    return f"s3://{bucket}/{prefix}"


def roughtime() -> list:
    addr, key = os.environ.get("BAGEL_ROUGHTIME_ADDR"), os.environ.get("BAGEL_ROUGHTIME_KEY")
    assert addr and key, "no Roughtime service: run under tests/run.sh"
    return [(addr, key)]


PYTHON = sys.executable


def libfaketime() -> str:
    """Debian's libfaketime (package faketime), wherever its architecture
    puts it."""
    for d in [Path("/usr/lib"), *sorted(Path("/usr/lib").iterdir())]:
        lib = d / "faketime" / "libfaketime.so.1"
        if lib.is_file():
            return str(lib)
    raise AssertionError("libfaketime is not installed (Debian: apt-get install faketime)")


def skewed_env(offset: str) -> dict:
    """The environment of a process whose wall (and monotonic) clock runs
    `offset` off (libfaketime's form: `+30s`, `-30s`), preloaded into the
    process itself rather than through the `faketime` wrapper, which
    leaves a semaphore behind when killed."""
    return {**os.environ, "LD_PRELOAD": libfaketime(), "FAKETIME": offset}
