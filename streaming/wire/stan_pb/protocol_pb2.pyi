from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NewOnly: _ClassVar[StartPosition]
    LastReceived: _ClassVar[StartPosition]
    TimeDeltaStart: _ClassVar[StartPosition]
    SequenceStart: _ClassVar[StartPosition]
    First: _ClassVar[StartPosition]
NewOnly: StartPosition
LastReceived: StartPosition
TimeDeltaStart: StartPosition
SequenceStart: StartPosition
First: StartPosition

class PubMsg(_message.Message):
    __slots__ = ("clientID", "guid", "subject", "reply", "data", "connID", "sha256")
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CONNID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    clientID: str
    guid: str
    subject: str
    reply: str
    data: bytes
    connID: bytes
    sha256: bytes
    def __init__(self, clientID: _Optional[str] = ..., guid: _Optional[str] = ..., subject: _Optional[str] = ..., reply: _Optional[str] = ..., data: _Optional[bytes] = ..., connID: _Optional[bytes] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class PubAck(_message.Message):
    __slots__ = ("guid", "error")
    GUID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    guid: str
    error: str
    def __init__(self, guid: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class MsgProto(_message.Message):
    __slots__ = ("sequence", "subject", "reply", "data", "timestamp", "redelivered", "redeliveryCount", "CRC32")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    REDELIVERYCOUNT_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    subject: str
    reply: str
    data: bytes
    timestamp: int
    redelivered: bool
    redeliveryCount: int
    CRC32: int
    def __init__(self, sequence: _Optional[int] = ..., subject: _Optional[str] = ..., reply: _Optional[str] = ..., data: _Optional[bytes] = ..., timestamp: _Optional[int] = ..., redelivered: _Optional[bool] = ..., redeliveryCount: _Optional[int] = ..., CRC32: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("subject", "sequence", "inProgress")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INPROGRESS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    sequence: int
    inProgress: bool
    def __init__(self, subject: _Optional[str] = ..., sequence: _Optional[int] = ..., inProgress: _Optional[bool] = ...) -> None: ...

class Nak(_message.Message):
    __slots__ = ("subject", "sequence", "delayMs")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DELAYMS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    sequence: int
    delayMs: int
    def __init__(self, subject: _Optional[str] = ..., sequence: _Optional[int] = ..., delayMs: _Optional[int] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("clientID", "heartbeatInbox", "protocol", "connID", "pingInterval", "pingMaxOut")
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEATINBOX_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CONNID_FIELD_NUMBER: _ClassVar[int]
    PINGINTERVAL_FIELD_NUMBER: _ClassVar[int]
    PINGMAXOUT_FIELD_NUMBER: _ClassVar[int]
    clientID: str
    heartbeatInbox: str
    protocol: int
    connID: bytes
    pingInterval: int
    pingMaxOut: int
    def __init__(self, clientID: _Optional[str] = ..., heartbeatInbox: _Optional[str] = ..., protocol: _Optional[int] = ..., connID: _Optional[bytes] = ..., pingInterval: _Optional[int] = ..., pingMaxOut: _Optional[int] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("pubPrefix", "subRequests", "unsubRequests", "closeRequests", "error", "subCloseRequests", "pingRequests", "pingInterval", "pingMaxOut", "protocol", "publicKey", "nakSuffix")
    PUBPREFIX_FIELD_NUMBER: _ClassVar[int]
    SUBREQUESTS_FIELD_NUMBER: _ClassVar[int]
    UNSUBREQUESTS_FIELD_NUMBER: _ClassVar[int]
    CLOSEREQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SUBCLOSEREQUESTS_FIELD_NUMBER: _ClassVar[int]
    PINGREQUESTS_FIELD_NUMBER: _ClassVar[int]
    PINGINTERVAL_FIELD_NUMBER: _ClassVar[int]
    PINGMAXOUT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    PUBLICKEY_FIELD_NUMBER: _ClassVar[int]
    NAKSUFFIX_FIELD_NUMBER: _ClassVar[int]
    pubPrefix: str
    subRequests: str
    unsubRequests: str
    closeRequests: str
    error: str
    subCloseRequests: str
    pingRequests: str
    pingInterval: int
    pingMaxOut: int
    protocol: int
    publicKey: str
    nakSuffix: str
    def __init__(self, pubPrefix: _Optional[str] = ..., subRequests: _Optional[str] = ..., unsubRequests: _Optional[str] = ..., closeRequests: _Optional[str] = ..., error: _Optional[str] = ..., subCloseRequests: _Optional[str] = ..., pingRequests: _Optional[str] = ..., pingInterval: _Optional[int] = ..., pingMaxOut: _Optional[int] = ..., protocol: _Optional[int] = ..., publicKey: _Optional[str] = ..., nakSuffix: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("connID",)
    CONNID_FIELD_NUMBER: _ClassVar[int]
    connID: bytes
    def __init__(self, connID: _Optional[bytes] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...

class SubscriptionRequest(_message.Message):
    __slots__ = ("clientID", "subject", "qGroup", "inbox", "maxInFlight", "ackWaitInSecs", "durableName", "startPosition", "startSequence", "startTimeDelta", "maxDeliver", "deadLetterChannel", "backoffMs", "maxInflightRedeliveries", "ordered")
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    QGROUP_FIELD_NUMBER: _ClassVar[int]
    INBOX_FIELD_NUMBER: _ClassVar[int]
    MAXINFLIGHT_FIELD_NUMBER: _ClassVar[int]
    ACKWAITINSECS_FIELD_NUMBER: _ClassVar[int]
    DURABLENAME_FIELD_NUMBER: _ClassVar[int]
    STARTPOSITION_FIELD_NUMBER: _ClassVar[int]
    STARTSEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STARTTIMEDELTA_FIELD_NUMBER: _ClassVar[int]
    MAXDELIVER_FIELD_NUMBER: _ClassVar[int]
    DEADLETTERCHANNEL_FIELD_NUMBER: _ClassVar[int]
    BACKOFFMS_FIELD_NUMBER: _ClassVar[int]
    MAXINFLIGHTREDELIVERIES_FIELD_NUMBER: _ClassVar[int]
    ORDERED_FIELD_NUMBER: _ClassVar[int]
    clientID: str
    subject: str
    qGroup: str
    inbox: str
    maxInFlight: int
    ackWaitInSecs: int
    durableName: str
    startPosition: StartPosition
    startSequence: int
    startTimeDelta: int
    maxDeliver: int
    deadLetterChannel: str
    backoffMs: _containers.RepeatedScalarFieldContainer[int]
    maxInflightRedeliveries: bool
    ordered: bool
    def __init__(self, clientID: _Optional[str] = ..., subject: _Optional[str] = ..., qGroup: _Optional[str] = ..., inbox: _Optional[str] = ..., maxInFlight: _Optional[int] = ..., ackWaitInSecs: _Optional[int] = ..., durableName: _Optional[str] = ..., startPosition: _Optional[_Union[StartPosition, str]] = ..., startSequence: _Optional[int] = ..., startTimeDelta: _Optional[int] = ..., maxDeliver: _Optional[int] = ..., deadLetterChannel: _Optional[str] = ..., backoffMs: _Optional[_Iterable[int]] = ..., maxInflightRedeliveries: _Optional[bool] = ..., ordered: _Optional[bool] = ...) -> None: ...

class SubscriptionResponse(_message.Message):
    __slots__ = ("ackInbox", "error")
    ACKINBOX_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ackInbox: str
    error: str
    def __init__(self, ackInbox: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class UnsubscribeRequest(_message.Message):
    __slots__ = ("clientID", "subject", "inbox", "durableName")
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    INBOX_FIELD_NUMBER: _ClassVar[int]
    DURABLENAME_FIELD_NUMBER: _ClassVar[int]
    clientID: str
    subject: str
    inbox: str
    durableName: str
    def __init__(self, clientID: _Optional[str] = ..., subject: _Optional[str] = ..., inbox: _Optional[str] = ..., durableName: _Optional[str] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("clientID",)
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    clientID: str
    def __init__(self, clientID: _Optional[str] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...
