#!/usr/bin/env python3
"""A Python client that knows nothing of bagel but its address discovers the
lease service by gRPC reflection and calls it.

It uses grpcio-reflection's client, which speaks the older
`grpc.reflection.v1alpha` protocol only (the reason bagel serves both it and
`grpc.reflection.v1`): the service list, then every message type, come from
the server; no generated code and no .proto file is used. It then takes a
lease, verifies its witness with the message types it discovered, and
releases it. Both reflection versions list every service the server
serves (health too). A conflict's details are decoded with the standard
decoder (grpcio-status): a `google.rpc.Status` holding the discovered
`bagel.v1.LeaseConflict` and a `google.rpc.RetryInfo`.

Run by tests/support/python.sh against a real bagel-server; exits non-zero
on any failure.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from grpc_reflection.v1alpha.reflection_pb2 import ServerReflectionRequest, ServerReflectionResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import bagel_client  # noqa: E402  (the witness verifier; it needs no generated code)

SERVICE = "bagel.v1.LeaseService"
# Every service a bagel-server serves on its gRPC port.
SERVED = sorted(
    [
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ]
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True, help="HOST:PORT")
    parser.add_argument("--key", required=True, help="the server's public key, hex")
    args = parser.parse_args()

    channel = grpc.insecure_channel(args.server)
    reflection = ProtoReflectionDescriptorDatabase(channel)
    services = reflection.get_services()
    print(f"services (v1alpha reflection): {services}")
    assert sorted(services) == SERVED, services
    # The newer protocol answers too. Its messages are the v1alpha ones
    # under another service name (same fields, same numbers), so the
    # v1alpha types serve for a raw call.
    v1 = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=ServerReflectionRequest.SerializeToString,
        response_deserializer=ServerReflectionResponse.FromString,
    )
    [answer] = list(v1(iter([ServerReflectionRequest(list_services="")]), timeout=10))
    v1_services = [s.name for s in answer.list_services_response.service]
    print(f"services (v1 reflection): {v1_services}")
    assert sorted(v1_services) == SERVED, v1_services

    pool = descriptor_pool.DescriptorPool(reflection)
    service = pool.FindServiceByName(SERVICE)
    methods = {m.name: m for m in service.methods}
    for needed in ("Acquire", "Renew", "Release", "ServerInfo", "Batch", "Session"):
        assert needed in methods, sorted(methods)

    def call(method: str, **fields):
        m = methods[method]
        request_cls = message_factory.GetMessageClass(m.input_type)
        response_cls = message_factory.GetMessageClass(m.output_type)
        stub = channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        return stub(request_cls(**fields), timeout=10)

    info = call("ServerInfo")
    print(f"ServerInfo: server {info.server_id}, version {info.version}, ready={info.ready}")
    assert info.ready, info
    key = bytes.fromhex(args.key)
    assert [k.ed25519 for k in info.keys] == [key], info.keys

    name = f"reflected-{time.time_ns()}"
    grant = call(
        "Acquire",
        names=[name],
        deadline_us=time.time_ns() // 1000 + 5_000_000,
        owner="reflection-test",
    ).grant
    witness_types = types.SimpleNamespace(
        WitnessBody=message_factory.GetMessageClass(pool.FindMessageTypeByName("bagel.v1.WitnessBody"))
    )
    body = bagel_client.verify_witness(grant.witness, {bagel_client.key_id(key): key}, witness_types)
    assert body.lease_id == grant.lease_id and [n.name for n in body.names] == [name], body
    print(f"Acquire {name}: lease {grant.lease_id}, witness verified with discovered types")

    # The conflict a second holder gets, with its details, as any client
    # sees it: the standard google.rpc.Status, decoded by grpcio-status.
    before_us = time.time_ns() // 1000
    try:
        call("Acquire", names=[name], deadline_us=time.time_ns() // 1000 + 5_000_000, owner="other")
        raise AssertionError("a held name was granted twice")
    except grpc.RpcError as e:
        after_us = time.time_ns() // 1000
        assert e.code() == grpc.StatusCode.ABORTED, e
        assert grant.lease_id in e.details(), e.details()
        status = rpc_status.from_call(e)
        assert status is not None, "no google.rpc.Status in the trailers"
        assert status.code == grpc.StatusCode.ABORTED.value[0] and status.message == e.details(), status
        conflict_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("bagel.v1.LeaseConflict"))
        assert [d.type_url for d in status.details] == [
            "type.googleapis.com/bagel.v1.LeaseConflict",
            "type.googleapis.com/google.rpc.RetryInfo",
        ], status.details
        conflict, retry = conflict_cls(), error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(conflict) and status.details[1].Unpack(retry), status.details
        assert conflict.name == name and conflict.holder_lease_id == grant.lease_id, conflict
        assert conflict.holder_deadline_us == grant.deadline_us, conflict
        # The time from the server's now (same host, same clock) to the
        # holder's deadline.
        delay_us = retry.retry_delay.ToMicroseconds()
        assert grant.deadline_us - after_us <= delay_us <= grant.deadline_us - before_us, (delay_us, grant)
        print(f"conflict: held by {conflict.holder_lease_id}, retry in {delay_us} us (google.rpc.Status)")

    released = call("Release", lease_id=grant.lease_id, token=grant.token)
    print(f"Release: stored watermark {released.watermark_us}")
    channel.close()
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
