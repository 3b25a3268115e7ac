from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SignedTime(_message.Message):
    __slots__ = ("local", "roughtime")
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    ROUGHTIME_FIELD_NUMBER: _ClassVar[int]
    local: LocalTimeProof
    roughtime: RoughtimeProof
    def __init__(self, local: _Optional[_Union[LocalTimeProof, _Mapping]] = ..., roughtime: _Optional[_Union[RoughtimeProof, _Mapping]] = ...) -> None: ...

class LocalTimeProof(_message.Message):
    __slots__ = ("body", "signature", "key_id")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    key_id: str
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ...) -> None: ...

class LocalTimeBody(_message.Message):
    __slots__ = ("time_us", "radius_us", "server_id")
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    RADIUS_US_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    time_us: int
    radius_us: int
    server_id: str
    def __init__(self, time_us: _Optional[int] = ..., radius_us: _Optional[int] = ..., server_id: _Optional[str] = ...) -> None: ...

class RoughtimeProof(_message.Message):
    __slots__ = ("request", "response", "public_key", "blind")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    BLIND_FIELD_NUMBER: _ClassVar[int]
    request: bytes
    response: bytes
    public_key: bytes
    blind: bytes
    def __init__(self, request: _Optional[bytes] = ..., response: _Optional[bytes] = ..., public_key: _Optional[bytes] = ..., blind: _Optional[bytes] = ...) -> None: ...
