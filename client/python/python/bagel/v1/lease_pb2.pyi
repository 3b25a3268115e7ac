from bagel.v1 import time_pb2 as _time_pb2
from bagel.v1 import witness_pb2 as _witness_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HistoryEvent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HISTORY_EVENT_UNSPECIFIED: _ClassVar[HistoryEvent]
    HISTORY_EVENT_RENEWED: _ClassVar[HistoryEvent]
    HISTORY_EVENT_RELEASED: _ClassVar[HistoryEvent]

class TimeSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIME_SOURCE_UNSPECIFIED: _ClassVar[TimeSource]
    TIME_SOURCE_LOCAL: _ClassVar[TimeSource]
    TIME_SOURCE_ROUGHTIME: _ClassVar[TimeSource]

class WatchEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WATCH_EVENT_KIND_UNSPECIFIED: _ClassVar[WatchEventKind]
    WATCH_EVENT_KIND_GRANTED: _ClassVar[WatchEventKind]
    WATCH_EVENT_KIND_RENEWED: _ClassVar[WatchEventKind]
    WATCH_EVENT_KIND_UPGRADED: _ClassVar[WatchEventKind]
    WATCH_EVENT_KIND_RELEASED: _ClassVar[WatchEventKind]
    WATCH_EVENT_KIND_BROKEN: _ClassVar[WatchEventKind]
    WATCH_EVENT_KIND_EXPIRED: _ClassVar[WatchEventKind]
    WATCH_EVENT_KIND_PROGRESS: _ClassVar[WatchEventKind]
HISTORY_EVENT_UNSPECIFIED: HistoryEvent
HISTORY_EVENT_RENEWED: HistoryEvent
HISTORY_EVENT_RELEASED: HistoryEvent
TIME_SOURCE_UNSPECIFIED: TimeSource
TIME_SOURCE_LOCAL: TimeSource
TIME_SOURCE_ROUGHTIME: TimeSource
WATCH_EVENT_KIND_UNSPECIFIED: WatchEventKind
WATCH_EVENT_KIND_GRANTED: WatchEventKind
WATCH_EVENT_KIND_RENEWED: WatchEventKind
WATCH_EVENT_KIND_UPGRADED: WatchEventKind
WATCH_EVENT_KIND_RELEASED: WatchEventKind
WATCH_EVENT_KIND_BROKEN: WatchEventKind
WATCH_EVENT_KIND_EXPIRED: WatchEventKind
WATCH_EVENT_KIND_PROGRESS: WatchEventKind

class AcquireRequest(_message.Message):
    __slots__ = ("names", "deadline_us", "owner", "mode", "wait_us", "holder_key", "ttl_us")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WAIT_US_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_US_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    deadline_us: int
    owner: str
    mode: _witness_pb2.Mode
    wait_us: int
    holder_key: bytes
    ttl_us: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., deadline_us: _Optional[int] = ..., owner: _Optional[str] = ..., mode: _Optional[_Union[_witness_pb2.Mode, str]] = ..., wait_us: _Optional[int] = ..., holder_key: _Optional[bytes] = ..., ttl_us: _Optional[int] = ...) -> None: ...

class NameGrant(_message.Message):
    __slots__ = ("name", "fencing_token", "previous")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    fencing_token: int
    previous: _witness_pb2.PreviousLease
    def __init__(self, name: _Optional[str] = ..., fencing_token: _Optional[int] = ..., previous: _Optional[_Union[_witness_pb2.PreviousLease, _Mapping]] = ...) -> None: ...

class LeaseGrant(_message.Message):
    __slots__ = ("lease_id", "token", "deadline_us", "min_timestamp_us", "names", "mode", "witness")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    MIN_TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WITNESS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    token: str
    deadline_us: int
    min_timestamp_us: int
    names: _containers.RepeatedCompositeFieldContainer[NameGrant]
    mode: _witness_pb2.Mode
    witness: _witness_pb2.Witness
    def __init__(self, lease_id: _Optional[str] = ..., token: _Optional[str] = ..., deadline_us: _Optional[int] = ..., min_timestamp_us: _Optional[int] = ..., names: _Optional[_Iterable[_Union[NameGrant, _Mapping]]] = ..., mode: _Optional[_Union[_witness_pb2.Mode, str]] = ..., witness: _Optional[_Union[_witness_pb2.Witness, _Mapping]] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: LeaseGrant
    def __init__(self, grant: _Optional[_Union[LeaseGrant, _Mapping]] = ...) -> None: ...

class LeaseConflict(_message.Message):
    __slots__ = ("name", "holder_lease_id", "holder_owner", "holder_mode", "holder_deadline_us")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLDER_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_OWNER_FIELD_NUMBER: _ClassVar[int]
    HOLDER_MODE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    name: str
    holder_lease_id: str
    holder_owner: str
    holder_mode: _witness_pb2.Mode
    holder_deadline_us: int
    def __init__(self, name: _Optional[str] = ..., holder_lease_id: _Optional[str] = ..., holder_owner: _Optional[str] = ..., holder_mode: _Optional[_Union[_witness_pb2.Mode, str]] = ..., holder_deadline_us: _Optional[int] = ...) -> None: ...

class UpgradeRequest(_message.Message):
    __slots__ = ("lease_id", "token")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    token: str
    def __init__(self, lease_id: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class UpgradeResponse(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: LeaseGrant
    def __init__(self, grant: _Optional[_Union[LeaseGrant, _Mapping]] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("data", "wildcard")
    DATA_FIELD_NUMBER: _ClassVar[int]
    WILDCARD_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    wildcard: bool
    def __init__(self, data: _Optional[bytes] = ..., wildcard: _Optional[bool] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_id", "token", "deadline_us", "metadata", "ttl_us")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TTL_US_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    token: str
    deadline_us: int
    metadata: Metadata
    ttl_us: int
    def __init__(self, lease_id: _Optional[str] = ..., token: _Optional[str] = ..., deadline_us: _Optional[int] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ..., ttl_us: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("deadline_us", "witness")
    DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    WITNESS_FIELD_NUMBER: _ClassVar[int]
    deadline_us: int
    witness: _witness_pb2.Witness
    def __init__(self, deadline_us: _Optional[int] = ..., witness: _Optional[_Union[_witness_pb2.Witness, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "token", "watermark_us", "signed_time", "metadata", "unsettled", "settled_through_us")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_US_FIELD_NUMBER: _ClassVar[int]
    SIGNED_TIME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    UNSETTLED_FIELD_NUMBER: _ClassVar[int]
    SETTLED_THROUGH_US_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    token: str
    watermark_us: int
    signed_time: _time_pb2.SignedTime
    metadata: Metadata
    unsettled: bool
    settled_through_us: int
    def __init__(self, lease_id: _Optional[str] = ..., token: _Optional[str] = ..., watermark_us: _Optional[int] = ..., signed_time: _Optional[_Union[_time_pb2.SignedTime, _Mapping]] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ..., unsettled: _Optional[bool] = ..., settled_through_us: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("watermark_us",)
    WATERMARK_US_FIELD_NUMBER: _ClassVar[int]
    watermark_us: int
    def __init__(self, watermark_us: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class Holder(_message.Message):
    __slots__ = ("lease_id", "owner", "mode", "deadline_us", "fencing_token", "granted_at_us")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_US_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    owner: str
    mode: _witness_pb2.Mode
    deadline_us: int
    fencing_token: int
    granted_at_us: int
    def __init__(self, lease_id: _Optional[str] = ..., owner: _Optional[str] = ..., mode: _Optional[_Union[_witness_pb2.Mode, str]] = ..., deadline_us: _Optional[int] = ..., fencing_token: _Optional[int] = ..., granted_at_us: _Optional[int] = ...) -> None: ...

class NameState(_message.Message):
    __slots__ = ("name", "holder", "previous", "fencing_token", "known", "waiters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    holder: Holder
    previous: _witness_pb2.PreviousLease
    fencing_token: int
    known: bool
    waiters: int
    def __init__(self, name: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., previous: _Optional[_Union[_witness_pb2.PreviousLease, _Mapping]] = ..., fencing_token: _Optional[int] = ..., known: _Optional[bool] = ..., waiters: _Optional[int] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedCompositeFieldContainer[NameState]
    def __init__(self, names: _Optional[_Iterable[_Union[NameState, _Mapping]]] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("lease_id", "owner", "event", "at_us", "watermark_us", "metadata")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    AT_US_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_US_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    owner: str
    event: HistoryEvent
    at_us: int
    watermark_us: int
    metadata: Metadata
    def __init__(self, lease_id: _Optional[str] = ..., owner: _Optional[str] = ..., event: _Optional[_Union[HistoryEvent, str]] = ..., at_us: _Optional[int] = ..., watermark_us: _Optional[int] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("entries", "truncated")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    truncated: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PublicKey(_message.Message):
    __slots__ = ("key_id", "ed25519")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    ED25519_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    ed25519: bytes
    def __init__(self, key_id: _Optional[str] = ..., ed25519: _Optional[bytes] = ...) -> None: ...

class ClockStatus(_message.Message):
    __slots__ = ("source", "error_bound_us", "healthy", "detail")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_BOUND_US_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    source: TimeSource
    error_bound_us: int
    healthy: bool
    detail: str
    def __init__(self, source: _Optional[_Union[TimeSource, str]] = ..., error_bound_us: _Optional[int] = ..., healthy: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class ServerInfoResponse(_message.Message):
    __slots__ = ("server_id", "epoch_us", "keys", "min_ttl_us", "max_ttl_us", "max_wait_us", "ready_at_us", "ready", "now_us", "clock", "forgotten_floor_us", "unsafe_skip_restart_wait", "max_names_per_request", "max_name_bytes", "max_owner_bytes", "max_metadata_bytes", "timestamp_tolerance_us", "version", "limits", "tls", "client_auth", "granted_until_us", "load", "access", "members")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_US_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MIN_TTL_US_FIELD_NUMBER: _ClassVar[int]
    MAX_TTL_US_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_US_FIELD_NUMBER: _ClassVar[int]
    READY_AT_US_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    NOW_US_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_FLOOR_US_FIELD_NUMBER: _ClassVar[int]
    UNSAFE_SKIP_RESTART_WAIT_FIELD_NUMBER: _ClassVar[int]
    MAX_NAMES_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_NAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OWNER_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_METADATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_TOLERANCE_US_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_AUTH_FIELD_NUMBER: _ClassVar[int]
    GRANTED_UNTIL_US_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    epoch_us: int
    keys: _containers.RepeatedCompositeFieldContainer[PublicKey]
    min_ttl_us: int
    max_ttl_us: int
    max_wait_us: int
    ready_at_us: int
    ready: bool
    now_us: int
    clock: ClockStatus
    forgotten_floor_us: int
    unsafe_skip_restart_wait: bool
    max_names_per_request: int
    max_name_bytes: int
    max_owner_bytes: int
    max_metadata_bytes: int
    timestamp_tolerance_us: int
    version: str
    limits: ServerLimits
    tls: bool
    client_auth: bool
    granted_until_us: int
    load: ServerLoad
    access: AccessInfo
    members: _containers.RepeatedCompositeFieldContainer[MemberList]
    def __init__(self, server_id: _Optional[str] = ..., epoch_us: _Optional[int] = ..., keys: _Optional[_Iterable[_Union[PublicKey, _Mapping]]] = ..., min_ttl_us: _Optional[int] = ..., max_ttl_us: _Optional[int] = ..., max_wait_us: _Optional[int] = ..., ready_at_us: _Optional[int] = ..., ready: _Optional[bool] = ..., now_us: _Optional[int] = ..., clock: _Optional[_Union[ClockStatus, _Mapping]] = ..., forgotten_floor_us: _Optional[int] = ..., unsafe_skip_restart_wait: _Optional[bool] = ..., max_names_per_request: _Optional[int] = ..., max_name_bytes: _Optional[int] = ..., max_owner_bytes: _Optional[int] = ..., max_metadata_bytes: _Optional[int] = ..., timestamp_tolerance_us: _Optional[int] = ..., version: _Optional[str] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., tls: _Optional[bool] = ..., client_auth: _Optional[bool] = ..., granted_until_us: _Optional[int] = ..., load: _Optional[_Union[ServerLoad, _Mapping]] = ..., access: _Optional[_Union[AccessInfo, _Mapping]] = ..., members: _Optional[_Iterable[_Union[MemberList, _Mapping]]] = ...) -> None: ...

class MemberList(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AccessInfo(_message.Message):
    __slots__ = ("policy_version", "policy_sha256", "identity", "identity_problem", "grants")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_SHA256_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    policy_sha256: str
    identity: str
    identity_problem: str
    grants: _containers.RepeatedCompositeFieldContainer[AccessGrant]
    def __init__(self, policy_version: _Optional[int] = ..., policy_sha256: _Optional[str] = ..., identity: _Optional[str] = ..., identity_problem: _Optional[str] = ..., grants: _Optional[_Iterable[_Union[AccessGrant, _Mapping]]] = ...) -> None: ...

class AccessGrant(_message.Message):
    __slots__ = ("prefix", "permissions")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    permissions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prefix: _Optional[str] = ..., permissions: _Optional[_Iterable[str]] = ...) -> None: ...

class ServerLoad(_message.Message):
    __slots__ = ("connections", "sessions", "held_names", "waiters", "inflight_bytes", "sessions_dropped", "watchers")
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    HELD_NAMES_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    WATCHERS_FIELD_NUMBER: _ClassVar[int]
    connections: int
    sessions: int
    held_names: int
    waiters: int
    inflight_bytes: int
    sessions_dropped: int
    watchers: int
    def __init__(self, connections: _Optional[int] = ..., sessions: _Optional[int] = ..., held_names: _Optional[int] = ..., waiters: _Optional[int] = ..., inflight_bytes: _Optional[int] = ..., sessions_dropped: _Optional[int] = ..., watchers: _Optional[int] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_batch_ops", "max_message_bytes", "max_streams_per_connection", "max_inflight_bytes_per_connection", "max_inflight_bytes", "max_connections", "idle_timeout_us", "keepalive_interval_us", "keepalive_timeout_us", "max_sessions", "session_buffer_bytes", "session_stall_timeout_us", "max_held_names", "max_held_names_per_owner", "max_held_names_per_peer", "max_records", "max_waiters_per_name", "max_waiters", "history_per_name", "history_budget_bytes", "shutdown_grace_us", "max_sessions_per_identity", "max_watchers_per_identity", "max_waiters_per_identity", "max_connections_per_identity", "max_unread_answer_bytes_per_identity")
    MAX_BATCH_OPS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAMS_PER_CONNECTION_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_BYTES_PER_CONNECTION_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_INTERVAL_US_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_STALL_TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    MAX_HELD_NAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_HELD_NAMES_PER_OWNER_FIELD_NUMBER: _ClassVar[int]
    MAX_HELD_NAMES_PER_PEER_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITERS_PER_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITERS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_PER_NAME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_GRACE_US_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_PER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MAX_WATCHERS_PER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITERS_PER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MAX_CONNECTIONS_PER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MAX_UNREAD_ANSWER_BYTES_PER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    max_batch_ops: int
    max_message_bytes: int
    max_streams_per_connection: int
    max_inflight_bytes_per_connection: int
    max_inflight_bytes: int
    max_connections: int
    idle_timeout_us: int
    keepalive_interval_us: int
    keepalive_timeout_us: int
    max_sessions: int
    session_buffer_bytes: int
    session_stall_timeout_us: int
    max_held_names: int
    max_held_names_per_owner: int
    max_held_names_per_peer: int
    max_records: int
    max_waiters_per_name: int
    max_waiters: int
    history_per_name: int
    history_budget_bytes: int
    shutdown_grace_us: int
    max_sessions_per_identity: int
    max_watchers_per_identity: int
    max_waiters_per_identity: int
    max_connections_per_identity: int
    max_unread_answer_bytes_per_identity: int
    def __init__(self, max_batch_ops: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_streams_per_connection: _Optional[int] = ..., max_inflight_bytes_per_connection: _Optional[int] = ..., max_inflight_bytes: _Optional[int] = ..., max_connections: _Optional[int] = ..., idle_timeout_us: _Optional[int] = ..., keepalive_interval_us: _Optional[int] = ..., keepalive_timeout_us: _Optional[int] = ..., max_sessions: _Optional[int] = ..., session_buffer_bytes: _Optional[int] = ..., session_stall_timeout_us: _Optional[int] = ..., max_held_names: _Optional[int] = ..., max_held_names_per_owner: _Optional[int] = ..., max_held_names_per_peer: _Optional[int] = ..., max_records: _Optional[int] = ..., max_waiters_per_name: _Optional[int] = ..., max_waiters: _Optional[int] = ..., history_per_name: _Optional[int] = ..., history_budget_bytes: _Optional[int] = ..., shutdown_grace_us: _Optional[int] = ..., max_sessions_per_identity: _Optional[int] = ..., max_watchers_per_identity: _Optional[int] = ..., max_waiters_per_identity: _Optional[int] = ..., max_connections_per_identity: _Optional[int] = ..., max_unread_answer_bytes_per_identity: _Optional[int] = ...) -> None: ...

class SignedNowRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SignedNowResponse(_message.Message):
    __slots__ = ("signed_time", "time_us", "radius_us")
    SIGNED_TIME_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    RADIUS_US_FIELD_NUMBER: _ClassVar[int]
    signed_time: _time_pb2.SignedTime
    time_us: int
    radius_us: int
    def __init__(self, signed_time: _Optional[_Union[_time_pb2.SignedTime, _Mapping]] = ..., time_us: _Optional[int] = ..., radius_us: _Optional[int] = ...) -> None: ...

class BatchOp(_message.Message):
    __slots__ = ("acquire", "renew", "upgrade", "release")
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    acquire: AcquireRequest
    renew: RenewRequest
    upgrade: UpgradeRequest
    release: ReleaseRequest
    def __init__(self, acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., renew: _Optional[_Union[RenewRequest, _Mapping]] = ..., upgrade: _Optional[_Union[UpgradeRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("ops", "lean")
    OPS_FIELD_NUMBER: _ClassVar[int]
    LEAN_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[BatchOp]
    lean: bool
    def __init__(self, ops: _Optional[_Iterable[_Union[BatchOp, _Mapping]]] = ..., lean: _Optional[bool] = ...) -> None: ...

class OpError(_message.Message):
    __slots__ = ("code", "message", "conflict", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    conflict: LeaseConflict
    details: bytes
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., conflict: _Optional[_Union[LeaseConflict, _Mapping]] = ..., details: _Optional[bytes] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("grant", "renewed", "released", "error", "lean_grant", "lean_renewed")
    GRANT_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEAN_GRANT_FIELD_NUMBER: _ClassVar[int]
    LEAN_RENEWED_FIELD_NUMBER: _ClassVar[int]
    grant: LeaseGrant
    renewed: RenewResponse
    released: ReleaseResponse
    error: OpError
    lean_grant: LeanGrant
    lean_renewed: LeanRenewal
    def __init__(self, grant: _Optional[_Union[LeaseGrant, _Mapping]] = ..., renewed: _Optional[_Union[RenewResponse, _Mapping]] = ..., released: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., error: _Optional[_Union[OpError, _Mapping]] = ..., lean_grant: _Optional[_Union[LeanGrant, _Mapping]] = ..., lean_renewed: _Optional[_Union[LeanRenewal, _Mapping]] = ...) -> None: ...

class LeanGrant(_message.Message):
    __slots__ = ("token", "body")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    token: str
    body: bytes
    def __init__(self, token: _Optional[str] = ..., body: _Optional[bytes] = ...) -> None: ...

class LeanRenewal(_message.Message):
    __slots__ = ("body",)
    BODY_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    def __init__(self, body: _Optional[bytes] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("results", "signed")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    signed: _witness_pb2.SignedRange
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ..., signed: _Optional[_Union[_witness_pb2.SignedRange, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "page_size", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    page_size: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListedName(_message.Message):
    __slots__ = ("name", "holder")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    name: str
    holder: Holder
    def __init__(self, name: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("names", "next_page_token", "max_page_size", "revision")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAX_PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedCompositeFieldContainer[ListedName]
    next_page_token: str
    max_page_size: int
    revision: int
    def __init__(self, names: _Optional[_Iterable[_Union[ListedName, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., max_page_size: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("names", "prefix", "from_revision", "progress_notify", "progress_interval_us")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FROM_REVISION_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_NOTIFY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_INTERVAL_US_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    prefix: str
    from_revision: int
    progress_notify: bool
    progress_interval_us: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., prefix: _Optional[str] = ..., from_revision: _Optional[int] = ..., progress_notify: _Optional[bool] = ..., progress_interval_us: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("revision", "kind", "name", "lease_id", "owner", "mode", "deadline_us", "at_us")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_US_FIELD_NUMBER: _ClassVar[int]
    AT_US_FIELD_NUMBER: _ClassVar[int]
    revision: int
    kind: WatchEventKind
    name: str
    lease_id: str
    owner: str
    mode: _witness_pb2.Mode
    deadline_us: int
    at_us: int
    def __init__(self, revision: _Optional[int] = ..., kind: _Optional[_Union[WatchEventKind, str]] = ..., name: _Optional[str] = ..., lease_id: _Optional[str] = ..., owner: _Optional[str] = ..., mode: _Optional[_Union[_witness_pb2.Mode, str]] = ..., deadline_us: _Optional[int] = ..., at_us: _Optional[int] = ...) -> None: ...
