from bagel.v1 import time_pb2 as _time_pb2
from bagel.v1 import witness_pb2 as _witness_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Batch(_message.Message):
    __slots__ = ("writer_id", "first_sequence", "signed_time", "witnesses", "entries", "log", "bucket_secs", "holder_signatures")
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_TIME_FIELD_NUMBER: _ClassVar[int]
    WITNESSES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SECS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    writer_id: str
    first_sequence: int
    signed_time: _time_pb2.SignedTime
    witnesses: _containers.RepeatedCompositeFieldContainer[_witness_pb2.Witness]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    log: str
    bucket_secs: int
    holder_signatures: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, writer_id: _Optional[str] = ..., first_sequence: _Optional[int] = ..., signed_time: _Optional[_Union[_time_pb2.SignedTime, _Mapping]] = ..., witnesses: _Optional[_Iterable[_Union[_witness_pb2.Witness, _Mapping]]] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., log: _Optional[str] = ..., bucket_secs: _Optional[int] = ..., holder_signatures: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("timestamp_us", "payload")
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    timestamp_us: int
    payload: bytes
    def __init__(self, timestamp_us: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class Summary(_message.Message):
    __slots__ = ("log", "from_secs", "to_secs", "witnesses", "signed_times", "writer_ids", "bags")
    LOG_FIELD_NUMBER: _ClassVar[int]
    FROM_SECS_FIELD_NUMBER: _ClassVar[int]
    TO_SECS_FIELD_NUMBER: _ClassVar[int]
    WITNESSES_FIELD_NUMBER: _ClassVar[int]
    SIGNED_TIMES_FIELD_NUMBER: _ClassVar[int]
    WRITER_IDS_FIELD_NUMBER: _ClassVar[int]
    BAGS_FIELD_NUMBER: _ClassVar[int]
    log: str
    from_secs: int
    to_secs: int
    witnesses: _containers.RepeatedCompositeFieldContainer[_witness_pb2.Witness]
    signed_times: _containers.RepeatedCompositeFieldContainer[_time_pb2.SignedTime]
    writer_ids: _containers.RepeatedScalarFieldContainer[str]
    bags: _containers.RepeatedCompositeFieldContainer[SummaryBag]
    def __init__(self, log: _Optional[str] = ..., from_secs: _Optional[int] = ..., to_secs: _Optional[int] = ..., witnesses: _Optional[_Iterable[_Union[_witness_pb2.Witness, _Mapping]]] = ..., signed_times: _Optional[_Iterable[_Union[_time_pb2.SignedTime, _Mapping]]] = ..., writer_ids: _Optional[_Iterable[str]] = ..., bags: _Optional[_Iterable[_Union[SummaryBag, _Mapping]]] = ...) -> None: ...

class SummaryBag(_message.Message):
    __slots__ = ("bucket_secs", "lock_sha256", "items")
    BUCKET_SECS_FIELD_NUMBER: _ClassVar[int]
    LOCK_SHA256_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    bucket_secs: int
    lock_sha256: bytes
    items: _containers.RepeatedCompositeFieldContainer[SummaryItem]
    def __init__(self, bucket_secs: _Optional[int] = ..., lock_sha256: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[SummaryItem, _Mapping]]] = ...) -> None: ...

class SummaryItem(_message.Message):
    __slots__ = ("name", "size", "batches", "raw", "is_raw")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    IS_RAW_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    batches: _containers.RepeatedCompositeFieldContainer[SummaryBatch]
    raw: bytes
    is_raw: bool
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[SummaryBatch, _Mapping]]] = ..., raw: _Optional[bytes] = ..., is_raw: _Optional[bool] = ...) -> None: ...

class SummaryBatch(_message.Message):
    __slots__ = ("writer", "first_sequence", "signed_time", "witnesses", "entries", "elsewhere", "log", "bucket_secs", "holder_signatures")
    WRITER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_TIME_FIELD_NUMBER: _ClassVar[int]
    WITNESSES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ELSEWHERE_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SECS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    writer: int
    first_sequence: int
    signed_time: int
    witnesses: _containers.RepeatedScalarFieldContainer[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    elsewhere: bool
    log: str
    bucket_secs: int
    holder_signatures: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, writer: _Optional[int] = ..., first_sequence: _Optional[int] = ..., signed_time: _Optional[int] = ..., witnesses: _Optional[_Iterable[int]] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., elsewhere: _Optional[bool] = ..., log: _Optional[str] = ..., bucket_secs: _Optional[int] = ..., holder_signatures: _Optional[_Iterable[bytes]] = ...) -> None: ...
