"""Which copy of a server is its current one: the copy token, the one authority.

Every copy of a server carries the token of the build or move that made it — its
*origin*, kept by the virt driver with the guest (``metadata.json`` for the local
driver, the domain's metadata for libvirt) — and the server's row says which token its
current copy has (``instances.copy_token``):

* a new server's build has a token of its own, given when the server is recorded, and
  every delivery of its build builds the guest with it;
* a move that arrives makes the copy it built current (the migration's uuid); a cold
  migration reverted makes the copy it started from current again (the migration's
  ``source_token``); a resize in place keeps the copy, and so its token;
* a server recorded by a release before tokens has none until it moves, and neither
  has the guest its build made: ``None`` matches ``None``.

A copy whose token is the server's current one is **never destroyed** while the server
lives — not by a build told to give up, not by a guest report, not by a move's end —
and a late result for a copy that is not current changes nothing. What the conductor
asks of every guest, every build check and every build result is :func:`is_current`.
"""

from __future__ import annotations

from uuid import UUID

from shared.objects.instance import Instance


def is_current(instance: Instance | None, token: UUID | None) -> bool:
    """Whether a copy carrying ``token`` is ``instance``'s current copy (a server that
    lives: one deleted, or being deleted, has none to protect)."""
    if instance is None or instance.deleted_at is not None or instance.task_state == "deleting":
        return False
    return instance.copy_token == token


def describe(token: UUID | None) -> str:
    """What made a copy, for an operator."""
    return "a build before copy tokens" if token is None else f"copy token {token}"
