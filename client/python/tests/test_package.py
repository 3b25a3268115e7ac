"""The package as installed: its version, its exceptions as the standard
library's families, and the generated gRPC modules (`bagel.v1`) living
beside it, so that a raw-gRPC client works with the wheel installed."""

from __future__ import annotations

import importlib.metadata
import re
import socket
import subprocess
import sys

import grpc
import pytest

import bagel
from conftest import PYTHON, REPO

sys.path.insert(0, str(REPO / "client" / "python"))
import grpc_gen  # noqa: E402


def test_the_version_is_the_wheel_s_and_the_workspace_s():
    workspace = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)
    assert bagel.__version__ == importlib.metadata.version("bagel") == workspace


def test_unavailable_is_a_connection_error():
    assert issubclass(bagel.Unavailable, ConnectionError)
    assert issubclass(bagel.Unavailable, bagel.BagelError)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Code that retries on network failures catches it as one.
    with pytest.raises(ConnectionError) as e:
        bagel.Client(f"http://127.0.0.1:{port}")
    assert isinstance(e.value, bagel.Unavailable) and e.value.retryable


def test_the_shipped_grpc_modules_are_what_the_protos_generate(tmp_path):
    fresh = grpc_gen.generate(tmp_path)
    shipped = grpc_gen.generated(grpc_gen.PACKAGE)
    assert [p.name for p in shipped] == [p.name for p in fresh]
    for ours, theirs in zip(shipped, fresh):
        assert ours.read_bytes() == theirs.read_bytes(), (
            f"{ours.name} is stale: python client/python/grpc_gen.py"
        )


def test_a_raw_grpc_client_beside_the_package(server):
    from bagel.v1 import lease_pb2, lease_pb2_grpc

    # The installed package's own modules, not a copy from elsewhere.
    assert lease_pb2.__file__.startswith(bagel.__path__[0])
    with grpc.insecure_channel(server.url.removeprefix("http://")) as channel:
        info = lease_pb2_grpc.LeaseServiceStub(channel).ServerInfo(lease_pb2.ServerInfoRequest(), timeout=30)
    assert info.keys[0].ed25519.hex() == server.key


def test_without_protobuf_bagel_v1_names_the_extra_that_brings_it():
    # `import bagel` needs no other package; `bagel.v1` says what it needs.
    script = "import sys; sys.modules['google.protobuf'] = None; import bagel; import bagel.v1"
    out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert 'pip install "bagel[grpc]"' in out.stderr, out.stderr


def test_the_documented_raw_grpc_example_runs_with_the_wheel_installed(server):
    """docs/operating.md's example, in the venv the wheel is installed in:
    it generates its own `bagel/v1` and imports `bagel.v1.lease_pb2`,
    which the installed package must not shadow."""
    out = subprocess.run(
        [PYTHON, str(REPO / "examples" / "python" / "bagel_client.py"), "--server", server.url, "--key", server.key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("ok"), out.stdout
