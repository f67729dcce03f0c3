"""Instance states, with Nova's names so the API can show them as the client expects."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class VmState(StrEnum):
    BUILDING = "building"
    ACTIVE = "active"
    STOPPED = "stopped"
    ERROR = "error"
    DELETED = "deleted"


class TaskState(StrEnum):
    SCHEDULING = "scheduling"
    SPAWNING = "spawning"
    DELETING = "deleting"
    POWERING_OFF = "powering-off"
    POWERING_ON = "powering-on"
    REBOOTING = "rebooting"
    REBOOTING_HARD = "rebooting_hard"


class PowerState(IntEnum):
    NOSTATE = 0
    RUNNING = 1
    PAUSED = 3
    SHUTDOWN = 4
    CRASHED = 6
    SUSPENDED = 7
