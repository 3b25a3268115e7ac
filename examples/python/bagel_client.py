#!/usr/bin/env python3
"""A bagel lease client in Python, and a witness verifier an auditor can read.

It generates the gRPC code from bagel's .proto files at run time (with
grpcio-tools, into a temporary directory: nothing generated is committed),
then:

1. acquires a lease on a name, verifies the witness signature (PyNaCl) over
   the exact body bytes the server sent, and only then decodes the body;
2. renews it (a new witness, verified the same way), and shows what a
   rival gets: ABORTED, with the holder and when to retry in the standard
   `google.rpc.Status` details (decoded by grpcio-status);
3. takes two more names in one Batch call, whose witnesses share one
   signature over a Merkle root, and verifies each on its own;
4. releases everything.

    pip install -r examples/python/requirements.txt
    python examples/python/bagel_client.py --server 127.0.0.1:7420 --key <public key hex>

`--key` is the server's public key as `bagel-server` prints it at start; pin
it out of band. Without it the example takes the key from ServerInfo, which
only shows that the witness came from whoever answered.

The witness format (also in the README, "Operating bagel"):

* A lone witness (`batched == false`): `signature` is an ed25519 signature of
  b"bagel.v1 witness\\0" + body.
* A batched witness (`batched == true`): `signature` is an ed25519 signature
  of b"bagel.v1 witness batch root\\0" + root, where root is computed from
  leaf = SHA-256(0x00 || body) by folding in `merkle_path` (leaf level first):
  at step i, if bit i of `leaf_index` is 0 the node is
  SHA-256(0x01 || node || sibling), else SHA-256(0x01 || sibling || node);
  after the last step the remaining `leaf_index` must be 0.
* `key_id` is the first 8 bytes of SHA-256(public key), as 16 hex digits.
* Never re-encode the body: protobuf encoding is not canonical.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

import grpc
import nacl.exceptions
import nacl.signing

WITNESS_DOMAIN = b"bagel.v1 witness\x00"
BATCH_ROOT_DOMAIN = b"bagel.v1 witness batch root\x00"
LOCAL_TIME_DOMAIN = b"bagel.v1 local time\x00"

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto" / "proto"


class WitnessError(Exception):
    """A witness that does not verify."""


def generate_code(out_dir: Path, proto_root: Path = PROTO_ROOT):
    """Compiles bagel's .proto files into out_dir and imports them."""
    from grpc_tools import protoc

    well_known = Path(importlib.import_module("grpc_tools").__file__).parent / "_proto"
    files = sorted(str(p.relative_to(proto_root)) for p in (proto_root / "bagel" / "v1").glob("*.proto"))
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *files,
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {files}")
    sys.path.insert(0, str(out_dir))
    lease_pb2 = importlib.import_module("bagel.v1.lease_pb2")
    lease_pb2_grpc = importlib.import_module("bagel.v1.lease_pb2_grpc")
    witness_pb2 = importlib.import_module("bagel.v1.witness_pb2")
    time_pb2 = importlib.import_module("bagel.v1.time_pb2")
    return lease_pb2, lease_pb2_grpc, witness_pb2, time_pb2


def key_id(public_key: bytes) -> str:
    """The id the server names its key by: SHA-256(key)[:8] in hex."""
    return hashlib.sha256(public_key).digest()[:8].hex()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_root(body: bytes, leaf_index: int, path: list[bytes]) -> bytes:
    """Folds a batched witness's body up its Merkle path to the root."""
    node = hashlib.sha256(b"\x00" + body).digest()
    index = leaf_index
    for sibling in path:
        if len(sibling) != 32:
            raise WitnessError(f"merkle path entry of {len(sibling)} bytes, expected 32")
        node = _node(node, sibling) if index & 1 == 0 else _node(sibling, node)
        index >>= 1
    if index != 0:
        raise WitnessError("leaf index beyond the merkle path")
    return node


def signed_message(witness) -> bytes:
    """What a witness's signature covers (see the module docs)."""
    if not witness.batched:
        return WITNESS_DOMAIN + witness.body
    return BATCH_ROOT_DOMAIN + merkle_root(witness.body, witness.leaf_index, list(witness.merkle_path))


def verify_witness(witness, keys: dict[str, bytes], witness_pb2):
    """Checks the signature over the body bytes as received, then decodes
    them. `keys` maps key id to raw 32-byte ed25519 public key."""
    public_key = keys.get(witness.key_id)
    if public_key is None:
        raise WitnessError(f"unknown key id {witness.key_id!r}")
    try:
        nacl.signing.VerifyKey(public_key).verify(signed_message(witness), witness.signature)
    except nacl.exceptions.BadSignatureError as e:
        raise WitnessError("bad witness signature") from e
    body = witness_pb2.WitnessBody()
    body.ParseFromString(witness.body)
    return body


def verify_local_time(signed_time, keys: dict[str, bytes], time_pb2):
    """A local time agent's signed reading: ed25519 over
    b"bagel.v1 local time\\0" + body. Returns (time_us, radius_us)."""
    local = signed_time.local
    public_key = keys.get(local.key_id)
    if public_key is None:
        raise WitnessError(f"unknown key id {local.key_id!r} on the signed time")
    try:
        nacl.signing.VerifyKey(public_key).verify(LOCAL_TIME_DOMAIN + local.body, local.signature)
    except nacl.exceptions.BadSignatureError as e:
        raise WitnessError("bad local time signature") from e
    body = time_pb2.LocalTimeBody()
    body.ParseFromString(local.body)
    return body.time_us, body.radius_us


def conflict_details(error: grpc.RpcError, lease_pb2):
    """The conflict and the retry delay (seconds) of a refused acquire.

    The status details are a standard `google.rpc.Status` (the gRPC richer
    error model): its `details` hold a `bagel.v1.LeaseConflict` and a
    `google.rpc.RetryInfo` (the time until the holder's deadline), each
    packed in an `Any`.
    """
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)
    check(status is not None, "a conflict carries google.rpc.Status details")
    conflict, retry_after_s = None, None
    for detail in status.details:
        if detail.Is(lease_pb2.LeaseConflict.DESCRIPTOR):
            conflict = lease_pb2.LeaseConflict()
            detail.Unpack(conflict)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after_s = retry.retry_delay.ToTimedelta().total_seconds()
    check(conflict is not None and retry_after_s is not None, f"details without the conflict or RetryInfo: {status}")
    return conflict, retry_after_s


def now_us() -> int:
    return time.time_ns() // 1000


def check(condition: bool, what: str):
    if not condition:
        raise AssertionError(what)


def run(server: str, pinned_key: str | None, name: str, gen_dir: Path) -> None:
    lease_pb2, lease_pb2_grpc, witness_pb2, time_pb2 = generate_code(gen_dir)
    channel = grpc.insecure_channel(server)
    leases = lease_pb2_grpc.LeaseServiceStub(channel)

    info = leases.ServerInfo(lease_pb2.ServerInfoRequest(), timeout=10)
    if pinned_key:
        key = bytes.fromhex(pinned_key)
        keys = {key_id(key): key}
        check(any(k.ed25519 == key for k in info.keys), "the server does not announce the pinned key")
    else:
        print("note: no --key given; trusting the key the server announces", file=sys.stderr)
        keys = {k.key_id: bytes(k.ed25519) for k in info.keys}
    for kid, key in keys.items():
        check(key_id(key) == kid, f"key id {kid} does not match its key")
    print(f"server {info.server_id} version {info.version}, ready={info.ready}, key ids {sorted(keys)}")

    # 1. Acquire.
    ttl_us = 5_000_000
    grant = leases.Acquire(
        lease_pb2.AcquireRequest(names=[name], deadline_us=now_us() + ttl_us, owner="python-example"),
        timeout=10,
    ).grant
    body = verify_witness(grant.witness, keys, witness_pb2)
    check(body.lease_id == grant.lease_id, "witness names another lease")
    check(body.deadline_us == grant.deadline_us, "witness states another deadline")
    check([n.name for n in body.names] == [name], "witness names other names")
    check(body.kind == witness_pb2.WITNESS_KIND_ACQUIRE, "not an acquire witness")
    previous = body.names[0].previous
    print(
        f"acquired {name}: lease {grant.lease_id}, fencing token {body.names[0].fencing_token}, "
        f"previous ended {witness_pb2.Ended.Name(previous.ended)} at watermark {previous.watermark_us}, "
        f"write after {body.min_timestamp_us}; witness verified (key {grant.witness.key_id})"
    )
    if body.self_timed:
        t_us, radius_us = verify_local_time(body.signed_time, keys, time_pb2)
        check(abs(t_us - body.issued_at_us) <= 10_000_000, "signed time far from the issue time")
        print(f"  signed time {t_us} ± {radius_us} us (the server's own clock, signed)")

    # A flipped byte must not verify.
    tampered = witness_pb2.Witness()
    tampered.CopyFrom(grant.witness)
    tampered.body = bytes([tampered.body[0] ^ 1]) + tampered.body[1:]
    try:
        verify_witness(tampered, keys, witness_pb2)
        raise AssertionError("a tampered witness verified")
    except WitnessError:
        pass

    # 2. Renew.
    renewed = leases.Renew(
        lease_pb2.RenewRequest(lease_id=grant.lease_id, token=grant.token, deadline_us=now_us() + ttl_us),
        timeout=10,
    )
    body = verify_witness(renewed.witness, keys, witness_pb2)
    check(body.kind == witness_pb2.WITNESS_KIND_RENEW, "not a renew witness")
    check(body.deadline_us == renewed.deadline_us, "renew witness states another deadline")
    print(f"renewed {grant.lease_id} until {renewed.deadline_us}; witness verified")

    # A rival is refused; the details say who holds the name and until when.
    try:
        leases.Acquire(
            lease_pb2.AcquireRequest(names=[name], deadline_us=now_us() + ttl_us, owner="python-rival"),
            timeout=10,
        )
        raise AssertionError("a held name was granted twice")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.ABORTED, f"a conflict is ABORTED, not {e.code()}")
        conflict, retry_after_s = conflict_details(e, lease_pb2)
        check(conflict.holder_lease_id == grant.lease_id, f"the conflict names another holder: {conflict}")
        check(conflict.holder_deadline_us == renewed.deadline_us, "the conflict states another deadline")
        print(f"a rival is refused: held by {conflict.holder_lease_id}; retry in {retry_after_s:.3f} s")

    # 3. Two more names in one Batch: one signature over a Merkle root.
    batch = leases.Batch(
        lease_pb2.BatchRequest(
            ops=[
                lease_pb2.BatchOp(
                    acquire=lease_pb2.AcquireRequest(
                        names=[f"{name}-{i}"], deadline_us=now_us() + ttl_us, owner="python-example"
                    )
                )
                for i in (1, 2)
            ]
        ),
        timeout=10,
    )
    batch_grants = [r.grant for r in batch.results]
    check(all(r.WhichOneof("result") == "grant" for r in batch.results), f"batch refused: {batch}")
    for g in batch_grants:
        check(g.witness.batched, "a batch of two is signed as one Merkle root")
        body = verify_witness(g.witness, keys, witness_pb2)
        check(body.lease_id == g.lease_id, "batched witness names another lease")
    print(
        f"batch: {len(batch_grants)} grants, one signature, each witness verified alone "
        f"(Merkle paths of {len(batch_grants[0].witness.merkle_path)} step(s))"
    )

    # 4. Release everything (watermark 0: this example wrote nothing).
    for g in [grant, *batch_grants]:
        released = leases.Release(lease_pb2.ReleaseRequest(lease_id=g.lease_id, token=g.token), timeout=10)
        print(f"released {g.lease_id}; stored watermark {released.watermark_us}")
    channel.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default=os.environ.get("BAGEL_SERVER", "127.0.0.1:7420"),
        help="HOST:PORT or http://HOST:PORT, as the bagel CLI takes it (default $BAGEL_SERVER)",
    )
    parser.add_argument("--key", help="the server's ed25519 public key, 64 hex digits (pin it)")
    parser.add_argument("--name", default=f"python-example-{os.getpid()}", help="the name to lease")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bagel-pb-") as gen:
        run(args.server.removeprefix("http://"), args.key, args.name, Path(gen))
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
