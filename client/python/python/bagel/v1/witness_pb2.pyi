from bagel.v1 import time_pb2 as _time_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_FULL: _ClassVar[Mode]
    MODE_TENTATIVE: _ClassVar[Mode]

class Ended(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENDED_UNSPECIFIED: _ClassVar[Ended]
    ENDED_NONE: _ClassVar[Ended]
    ENDED_RELEASED: _ClassVar[Ended]
    ENDED_BROKEN: _ClassVar[Ended]
    ENDED_UNKNOWN: _ClassVar[Ended]

class WitnessKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WITNESS_KIND_UNSPECIFIED: _ClassVar[WitnessKind]
    WITNESS_KIND_ACQUIRE: _ClassVar[WitnessKind]
    WITNESS_KIND_UPGRADE: _ClassVar[WitnessKind]
    WITNESS_KIND_RENEW: _ClassVar[WitnessKind]
MODE_UNSPECIFIED: Mode
MODE_FULL: Mode
MODE_TENTATIVE: Mode
ENDED_UNSPECIFIED: Ended
ENDED_NONE: Ended
ENDED_RELEASED: Ended
ENDED_BROKEN: Ended
ENDED_UNKNOWN: Ended
WITNESS_KIND_UNSPECIFIED: WitnessKind
WITNESS_KIND_ACQUIRE: WitnessKind
WITNESS_KIND_UPGRADE: WitnessKind
WITNESS_KIND_RENEW: WitnessKind

class PreviousLease(_message.Message):
    __slots__ = ("lease_id", "watermark_us", "watermark_signed_time", "ended", "ended_at_us", "unsettled_until_us", "granted_at_us")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_US_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_SIGNED_TIME_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_US_FIELD_NUMBER: _ClassVar[int]
    UNSETTLED_UNTIL_US_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_US_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    watermark_us: int
    watermark_signed_time: _time_pb2.SignedTime
    ended: Ended
    ended_at_us: int
    unsettled_until_us: int
    granted_at_us: int
    def __init__(self, lease_id: _Optional[str] = ..., watermark_us: _Optional[int] = ..., watermark_signed_time: _Optional[_Union[_time_pb2.SignedTime, _Mapping]] = ..., ended: _Optional[_Union[Ended, str]] = ..., ended_at_us: _Optional[int] = ..., unsettled_until_us: _Optional[int] = ..., granted_at_us: _Optional[int] = ...) -> None: ...

class WitnessName(_message.Message):
    __slots__ = ("name", "fencing_token", "previous")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    fencing_token: int
    previous: PreviousLease
    def __init__(self, name: _Optional[str] = ..., fencing_token: _Optional[int] = ..., previous: _Optional[_Union[PreviousLease, _Mapping]] = ...) -> None: ...

class WitnessBody(_message.Message):
    __slots__ = ("lease_id", "names", "owner", "mode", "kind", "deadline_us", "min_timestamp_us", "issued_at_us", "signed_time", "server_id", "epoch_us", "self_timed", "holder_key")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    MIN_TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_US_FIELD_NUMBER: _ClassVar[int]
    SIGNED_TIME_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_US_FIELD_NUMBER: _ClassVar[int]
    SELF_TIMED_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KEY_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    names: _containers.RepeatedCompositeFieldContainer[WitnessName]
    owner: str
    mode: Mode
    kind: WitnessKind
    deadline_us: int
    min_timestamp_us: int
    issued_at_us: int
    signed_time: _time_pb2.SignedTime
    server_id: str
    epoch_us: int
    self_timed: bool
    holder_key: bytes
    def __init__(self, lease_id: _Optional[str] = ..., names: _Optional[_Iterable[_Union[WitnessName, _Mapping]]] = ..., owner: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., kind: _Optional[_Union[WitnessKind, str]] = ..., deadline_us: _Optional[int] = ..., min_timestamp_us: _Optional[int] = ..., issued_at_us: _Optional[int] = ..., signed_time: _Optional[_Union[_time_pb2.SignedTime, _Mapping]] = ..., server_id: _Optional[str] = ..., epoch_us: _Optional[int] = ..., self_timed: _Optional[bool] = ..., holder_key: _Optional[bytes] = ...) -> None: ...

class Witness(_message.Message):
    __slots__ = ("body", "signature", "key_id", "batched", "leaf_index", "merkle_path")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCHED_FIELD_NUMBER: _ClassVar[int]
    LEAF_INDEX_FIELD_NUMBER: _ClassVar[int]
    MERKLE_PATH_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    key_id: str
    batched: bool
    leaf_index: int
    merkle_path: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ..., batched: _Optional[bool] = ..., leaf_index: _Optional[int] = ..., merkle_path: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SignedRange(_message.Message):
    __slots__ = ("signature", "key_id", "batched", "depth", "first_leaf", "nodes")
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCHED_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    FIRST_LEAF_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    signature: bytes
    key_id: str
    batched: bool
    depth: int
    first_leaf: int
    nodes: bytes
    def __init__(self, signature: _Optional[bytes] = ..., key_id: _Optional[str] = ..., batched: _Optional[bool] = ..., depth: _Optional[int] = ..., first_leaf: _Optional[int] = ..., nodes: _Optional[bytes] = ...) -> None: ...
