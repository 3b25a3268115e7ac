from bagel.v1 import time_pb2 as _time_pb2
from bagel.v1 import witness_pb2 as _witness_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SummaryV2(_message.Message):
    __slots__ = ("format", "log", "from_secs", "to_secs", "witnesses", "signed_times", "writer_ids", "key_ids", "item_names", "bags")
    class Time(_message.Message):
        __slots__ = ("body", "signature", "key_id", "other")
        BODY_FIELD_NUMBER: _ClassVar[int]
        SIGNATURE_FIELD_NUMBER: _ClassVar[int]
        KEY_ID_FIELD_NUMBER: _ClassVar[int]
        OTHER_FIELD_NUMBER: _ClassVar[int]
        body: bytes
        signature: bytes
        key_id: int
        other: _time_pb2.SignedTime
        def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[int] = ..., other: _Optional[_Union[_time_pb2.SignedTime, _Mapping]] = ...) -> None: ...
    class Bag(_message.Message):
        __slots__ = ("bucket_secs", "lock_sha256", "items")
        BUCKET_SECS_FIELD_NUMBER: _ClassVar[int]
        LOCK_SHA256_FIELD_NUMBER: _ClassVar[int]
        ITEMS_FIELD_NUMBER: _ClassVar[int]
        bucket_secs: int
        lock_sha256: bytes
        items: _containers.RepeatedCompositeFieldContainer[SummaryV2.Item]
        def __init__(self, bucket_secs: _Optional[int] = ..., lock_sha256: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[SummaryV2.Item, _Mapping]]] = ...) -> None: ...
    class Item(_message.Message):
        __slots__ = ("name", "size", "batches", "raw", "is_raw")
        NAME_FIELD_NUMBER: _ClassVar[int]
        SIZE_FIELD_NUMBER: _ClassVar[int]
        BATCHES_FIELD_NUMBER: _ClassVar[int]
        RAW_FIELD_NUMBER: _ClassVar[int]
        IS_RAW_FIELD_NUMBER: _ClassVar[int]
        name: int
        size: int
        batches: _containers.RepeatedCompositeFieldContainer[SummaryV2.Batch]
        raw: bytes
        is_raw: bool
        def __init__(self, name: _Optional[int] = ..., size: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[SummaryV2.Batch, _Mapping]]] = ..., raw: _Optional[bytes] = ..., is_raw: _Optional[bool] = ...) -> None: ...
    class Batch(_message.Message):
        __slots__ = ("writer", "sequence_gap", "signed_time_step", "witnesses", "timestamps", "payloads", "elsewhere", "log", "bucket_secs", "holder_signatures")
        WRITER_FIELD_NUMBER: _ClassVar[int]
        SEQUENCE_GAP_FIELD_NUMBER: _ClassVar[int]
        SIGNED_TIME_STEP_FIELD_NUMBER: _ClassVar[int]
        WITNESSES_FIELD_NUMBER: _ClassVar[int]
        TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
        PAYLOADS_FIELD_NUMBER: _ClassVar[int]
        ELSEWHERE_FIELD_NUMBER: _ClassVar[int]
        LOG_FIELD_NUMBER: _ClassVar[int]
        BUCKET_SECS_FIELD_NUMBER: _ClassVar[int]
        HOLDER_SIGNATURES_FIELD_NUMBER: _ClassVar[int]
        writer: int
        sequence_gap: int
        signed_time_step: int
        witnesses: _containers.RepeatedScalarFieldContainer[int]
        timestamps: _containers.RepeatedScalarFieldContainer[int]
        payloads: _containers.RepeatedScalarFieldContainer[bytes]
        elsewhere: bool
        log: str
        bucket_secs: int
        holder_signatures: _containers.RepeatedScalarFieldContainer[bytes]
        def __init__(self, writer: _Optional[int] = ..., sequence_gap: _Optional[int] = ..., signed_time_step: _Optional[int] = ..., witnesses: _Optional[_Iterable[int]] = ..., timestamps: _Optional[_Iterable[int]] = ..., payloads: _Optional[_Iterable[bytes]] = ..., elsewhere: _Optional[bool] = ..., log: _Optional[str] = ..., bucket_secs: _Optional[int] = ..., holder_signatures: _Optional[_Iterable[bytes]] = ...) -> None: ...
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    FROM_SECS_FIELD_NUMBER: _ClassVar[int]
    TO_SECS_FIELD_NUMBER: _ClassVar[int]
    WITNESSES_FIELD_NUMBER: _ClassVar[int]
    SIGNED_TIMES_FIELD_NUMBER: _ClassVar[int]
    WRITER_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_IDS_FIELD_NUMBER: _ClassVar[int]
    ITEM_NAMES_FIELD_NUMBER: _ClassVar[int]
    BAGS_FIELD_NUMBER: _ClassVar[int]
    format: int
    log: str
    from_secs: int
    to_secs: int
    witnesses: _containers.RepeatedCompositeFieldContainer[_witness_pb2.Witness]
    signed_times: _containers.RepeatedCompositeFieldContainer[SummaryV2.Time]
    writer_ids: _containers.RepeatedScalarFieldContainer[str]
    key_ids: _containers.RepeatedScalarFieldContainer[str]
    item_names: _containers.RepeatedScalarFieldContainer[str]
    bags: _containers.RepeatedCompositeFieldContainer[SummaryV2.Bag]
    def __init__(self, format: _Optional[int] = ..., log: _Optional[str] = ..., from_secs: _Optional[int] = ..., to_secs: _Optional[int] = ..., witnesses: _Optional[_Iterable[_Union[_witness_pb2.Witness, _Mapping]]] = ..., signed_times: _Optional[_Iterable[_Union[SummaryV2.Time, _Mapping]]] = ..., writer_ids: _Optional[_Iterable[str]] = ..., key_ids: _Optional[_Iterable[str]] = ..., item_names: _Optional[_Iterable[str]] = ..., bags: _Optional[_Iterable[_Union[SummaryV2.Bag, _Mapping]]] = ...) -> None: ...
