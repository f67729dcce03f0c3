"""The one exception hierarchy of keel.

    KeelError
    ├── ConfigError                 a setting is missing or has a bad value
    ├── NotFound
    │   ├── InstanceNotFound
    │   ├── FlavorNotFound
    │   ├── ImageNotFound
    │   ├── ServiceNotFound
    │   ├── ComputeNodeNotFound
    │   ├── ProjectNotFound
    │   ├── UserNotFound
    │   ├── RoleNotFound
    │   ├── KeyPairNotFound
    │   ├── ServerGroupNotFound
    │   ├── AggregateNotFound
    │   └── ConsoleNotAvailable     a guest's console log cannot be read
    ├── Conflict
    │   ├── InstanceInvalidState
    │   ├── NoMoreFixedIps          every address of the network is taken
    │   └── AlreadyExists           a name is already taken (project, user, key pair)
    ├── InvalidFixedIp              a requested fixed address cannot be given
    ├── HostTaskRefused             a drain or evacuation of a host cannot be started as asked
    ├── OverQuota                   a request would take a project past one of its quotas
    ├── ImageProtected              a protected image cannot be deleted
    ├── NoValidHost                 the scheduler found no host for a request
    ├── IdentityRefused             an agent's node identity does not match the database
    │   ├── HostRenameDetected      its node belongs to a service on another host
    │   ├── IdentityLost            its host registered before, but it has no identity file
    │   ├── DuplicateComputeNode    its host already has a node with another UUID
    │   ├── HypervisorInUse         a new host whose hypervisor already holds servers
    │   └── ComputeNodeDeleted      its node was deleted by an operator
    ├── ServiceTooOld               this release is too old for the deployment
    ├── HostHeld                    another keel-compute runs with this state directory
    ├── CallerRefused               the broker user that sent a request may not ask it
    ├── BuildFailed                 the virt driver could not build a guest
    ├── GuestNotFound               the hypervisor has no guest for an instance
    ├── TransientError              a temporary failure: the same request may succeed later
    └── MessagingError
        ├── MessagingTimeout        no reply to a call within its timeout
        ├── Unroutable              no queue is bound for the call's topic
        ├── ReplyQueueLost          the caller's reply queue went away before the answer came
        ├── RemoteError             the remote side failed with an error not on the allow-list
        ├── NoSuchMethod            the server has no such RPC method
        ├── UnsupportedVersion      the server does not speak the requested RPC version
        └── InvalidMessage          the message could not be parsed or validated

Errors raised by an RPC handler travel back to the caller by name. Only the names in
``REMOTE_ALLOWED`` are rebuilt as their own class on the caller's side; anything else
arrives as :class:`RemoteError`, so a remote peer can never make us instantiate an
arbitrary class.
"""

from __future__ import annotations


class KeelError(Exception):
    """Base of every error keel raises on purpose.

    ``message`` is written for the operator: it says what is wrong and, where it can,
    what to do about it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(KeelError):
    pass


class NotFound(KeelError):
    pass


class InstanceNotFound(NotFound):
    pass


class FlavorNotFound(NotFound):
    pass


class ImageNotFound(NotFound):
    pass


class ServiceNotFound(NotFound):
    pass


class ComputeNodeNotFound(NotFound):
    pass


class ProjectNotFound(NotFound):
    pass


class UserNotFound(NotFound):
    pass


class RoleNotFound(NotFound):
    pass


class ConsoleNotAvailable(NotFound):
    """The guest exists, but its console log cannot be read."""


class KeyPairNotFound(NotFound):
    pass


class ServerGroupNotFound(NotFound):
    pass


class AggregateNotFound(NotFound):
    pass


class Conflict(KeelError):
    pass


class AlreadyExists(Conflict):
    pass


class OverQuota(KeelError):
    """A request would exceed a quota; the message says which and by how much."""

    @classmethod
    def exceeded(
        cls, overs: list[str], requested: list[int], used: list[int], allowed: list[int]
    ) -> OverQuota:
        """The message the compute API gives, naming each resource over its limit."""

        def joined(values: list[int] | list[str]) -> str:
            return ", ".join(str(value) for value in values)

        return cls(
            f"Quota exceeded for {joined(overs)}: Requested {joined(requested)}, but already "
            f"used {joined(used)} of {joined(allowed)} {joined(overs)}"
        )


class ImageProtected(KeelError):
    """A protected image cannot be deleted (until it is unprotected); the message is the
    Image API's."""

    @classmethod
    def of(cls, image_id: object) -> ImageProtected:
        return cls(f"Image {image_id} is protected and cannot be deleted.")


class InstanceInvalidState(Conflict):
    pass


class NoMoreFixedIps(Conflict):
    pass


class InvalidFixedIp(KeelError):
    pass


class HostTaskRefused(KeelError):
    """A host task (drain, evacuate) cannot be started as asked: the message says why."""


class NoValidHost(KeelError):
    def __init__(self, reason: str = "") -> None:
        message = "No valid host was found. " + reason if reason else "No valid host was found."
        super().__init__(message.strip())


class IdentityRefused(KeelError):
    """An agent may not start as the node it presents; the message says what to do."""


class HostRenameDetected(IdentityRefused):
    pass


class IdentityLost(IdentityRefused):
    pass


class DuplicateComputeNode(IdentityRefused):
    pass


class HypervisorInUse(IdentityRefused):
    pass


class ComputeNodeDeleted(IdentityRefused):
    pass


class ServiceTooOld(KeelError):
    pass


class HostHeld(KeelError):
    pass


class CallerRefused(KeelError):
    """The broker user that sent an RPC request may not ask it (an agent asking about
    another host's instance, say)."""


class BuildFailed(KeelError):
    pass


class GuestNotFound(KeelError):
    """The hypervisor has no guest for the instance."""


class GuestStateError(KeelError):
    """The guest is in a power state the operation cannot start from (pausing one that
    is shut off, say)."""


class TransientError(KeelError):
    """A failure that says nothing about the request: the same request may succeed later.

    A handler raises it to have its message delivered again; a server answers a call
    with it when the handler kept meeting transient failures (see
    :mod:`shared.rpc.settlement`).
    """


class MessagingError(KeelError):
    pass


class MessagingTimeout(MessagingError):
    pass


class Unroutable(MessagingError):
    pass


class ReplyQueueLost(MessagingError):
    """A call's reply queue went away before the answer came: the caller's connection to
    RabbitMQ dropped (its node died, restarted or was paused) while it waited.

    The request may or may not have been handled; a call that is safe to repeat is sent
    again (:meth:`shared.rpc.client.RPCClient.call` with ``idempotent=True``).
    """


class RemoteError(MessagingError):
    """A remote handler failed with an error that is not rebuilt by name."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type
        self.remote_message = message


class NoSuchMethod(MessagingError):
    pass


class UnsupportedVersion(MessagingError):
    pass


class InvalidMessage(MessagingError):
    pass


#: Errors that are rebuilt as their own class when they come back from an RPC call.
REMOTE_ALLOWED: dict[str, type[KeelError]] = {
    cls.__name__: cls
    for cls in (
        InstanceNotFound,
        FlavorNotFound,
        ImageNotFound,
        ServiceNotFound,
        ComputeNodeNotFound,
        InstanceInvalidState,
        Conflict,
        NoValidHost,
        HostRenameDetected,
        IdentityLost,
        DuplicateComputeNode,
        HypervisorInUse,
        ComputeNodeDeleted,
        ServiceTooOld,
        CallerRefused,
        BuildFailed,
        GuestNotFound,
        ConsoleNotAvailable,
        TransientError,
        NoSuchMethod,
        UnsupportedVersion,
        InvalidMessage,
    )
}


def rebuild_remote(exc_type: str, message: str) -> KeelError:
    """Turn an error name and message from the wire into an exception, safely."""
    cls = REMOTE_ALLOWED.get(exc_type)
    if cls is None:
        return RemoteError(exc_type, message)
    error = cls.__new__(cls)
    KeelError.__init__(error, message)
    return error
