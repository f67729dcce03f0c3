"""Projects, users, the role a user holds in a project, and what an issued token stands for."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from shared.objects.base import KeelModel

#: The one domain keel knows; every user and project is in it.
DEFAULT_DOMAIN_ID = "default"
DEFAULT_DOMAIN_NAME = "Default"


class Role(StrEnum):
    MEMBER = "member"
    ADMIN = "admin"

    @property
    def granted(self) -> tuple[str, ...]:
        """The role names a token carries: admin implies member, and both imply reader."""
        if self is Role.ADMIN:
            return ("admin", "member", "reader")
        return ("member", "reader")


class Project(KeelModel):
    id: str
    name: str
    description: str
    created_at: datetime


class User(KeelModel):
    """A user, without the password hash (which only the password check reads)."""

    id: str
    name: str
    default_project_id: str | None
    created_at: datetime
    password_changed_at: datetime


class Membership(KeelModel):
    """A user's role in one project."""

    user: User
    project: Project
    role: Role


class IssuedToken(KeelModel):
    """A live token: who it authenticates, in which project, until when."""

    membership: Membership
    audit_id: str
    issued_at: datetime
    expires_at: datetime
