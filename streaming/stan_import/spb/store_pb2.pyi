from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SubState(_message.Message):
    __slots__ = ("ID", "clientID", "qGroup", "inbox", "ackInbox", "maxInFlight", "ackWaitInSecs", "durableName", "lastSent", "isDurable", "isClosed")
    ID_FIELD_NUMBER: _ClassVar[int]
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    QGROUP_FIELD_NUMBER: _ClassVar[int]
    INBOX_FIELD_NUMBER: _ClassVar[int]
    ACKINBOX_FIELD_NUMBER: _ClassVar[int]
    MAXINFLIGHT_FIELD_NUMBER: _ClassVar[int]
    ACKWAITINSECS_FIELD_NUMBER: _ClassVar[int]
    DURABLENAME_FIELD_NUMBER: _ClassVar[int]
    LASTSENT_FIELD_NUMBER: _ClassVar[int]
    ISDURABLE_FIELD_NUMBER: _ClassVar[int]
    ISCLOSED_FIELD_NUMBER: _ClassVar[int]
    ID: int
    clientID: str
    qGroup: str
    inbox: str
    ackInbox: str
    maxInFlight: int
    ackWaitInSecs: int
    durableName: str
    lastSent: int
    isDurable: bool
    isClosed: bool
    def __init__(self, ID: _Optional[int] = ..., clientID: _Optional[str] = ..., qGroup: _Optional[str] = ..., inbox: _Optional[str] = ..., ackInbox: _Optional[str] = ..., maxInFlight: _Optional[int] = ..., ackWaitInSecs: _Optional[int] = ..., durableName: _Optional[str] = ..., lastSent: _Optional[int] = ..., isDurable: _Optional[bool] = ..., isClosed: _Optional[bool] = ...) -> None: ...

class SubStateDelete(_message.Message):
    __slots__ = ("ID",)
    ID_FIELD_NUMBER: _ClassVar[int]
    ID: int
    def __init__(self, ID: _Optional[int] = ...) -> None: ...

class SubStateUpdate(_message.Message):
    __slots__ = ("ID", "seqno")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEQNO_FIELD_NUMBER: _ClassVar[int]
    ID: int
    seqno: int
    def __init__(self, ID: _Optional[int] = ..., seqno: _Optional[int] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("ClusterID", "Discovery", "Publish", "Subscribe", "Unsubscribe", "Close", "SubClose", "AcksSubs", "NodeID")
    CLUSTERID_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    SUBCLOSE_FIELD_NUMBER: _ClassVar[int]
    ACKSSUBS_FIELD_NUMBER: _ClassVar[int]
    NODEID_FIELD_NUMBER: _ClassVar[int]
    ClusterID: str
    Discovery: str
    Publish: str
    Subscribe: str
    Unsubscribe: str
    Close: str
    SubClose: str
    AcksSubs: str
    NodeID: str
    def __init__(self, ClusterID: _Optional[str] = ..., Discovery: _Optional[str] = ..., Publish: _Optional[str] = ..., Subscribe: _Optional[str] = ..., Unsubscribe: _Optional[str] = ..., Close: _Optional[str] = ..., SubClose: _Optional[str] = ..., AcksSubs: _Optional[str] = ..., NodeID: _Optional[str] = ...) -> None: ...

class ClientInfo(_message.Message):
    __slots__ = ("ID", "HbInbox", "ConnID", "Protocol", "PingInterval", "PingMaxOut")
    ID_FIELD_NUMBER: _ClassVar[int]
    HBINBOX_FIELD_NUMBER: _ClassVar[int]
    CONNID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    PINGINTERVAL_FIELD_NUMBER: _ClassVar[int]
    PINGMAXOUT_FIELD_NUMBER: _ClassVar[int]
    ID: str
    HbInbox: str
    ConnID: bytes
    Protocol: int
    PingInterval: int
    PingMaxOut: int
    def __init__(self, ID: _Optional[str] = ..., HbInbox: _Optional[str] = ..., ConnID: _Optional[bytes] = ..., Protocol: _Optional[int] = ..., PingInterval: _Optional[int] = ..., PingMaxOut: _Optional[int] = ...) -> None: ...

class ClientDelete(_message.Message):
    __slots__ = ("ID",)
    ID_FIELD_NUMBER: _ClassVar[int]
    ID: str
    def __init__(self, ID: _Optional[str] = ...) -> None: ...
