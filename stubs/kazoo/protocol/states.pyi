from typing import NamedTuple

class KazooState:
    SUSPENDED: str
    CONNECTED: str
    LOST: str

class KeeperState:
    EXPIRED_SESSION: str
    CONNECTED: str
    CLOSED: str

class EventType:
    NONE: str

class WatchedEvent(NamedTuple):
    type: str
    state: str
    path: str | None

class ZnodeStat(NamedTuple):
    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    version: int
    cversion: int
    aversion: int
    ephemeralOwner: int
    dataLength: int
    numChildren: int
    pzxid: int
