"""Projects, users, roles, the roles a user holds in a project, and what a token stands for."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from shared.objects.base import KeelModel

#: The one domain keel knows; every user and project is in it.
DEFAULT_DOMAIN_ID = "default"
DEFAULT_DOMAIN_NAME = "Default"

#: The roles ``keel-manage`` and ``make run`` give by default, and the admin role.
MEMBER_ROLE = "member"
ADMIN_ROLE = "admin"


class Role(KeelModel):
    id: str
    name: str
    description: str | None = None
    #: Attributes Keystone keeps without knowing them, given on create or update.
    extra: dict[str, Any] = Field(default_factory=dict)


class Project(KeelModel):
    id: str
    name: str
    description: str
    enabled: bool = True
    extra: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class User(KeelModel):
    """A user, without the password hash (which only the password check reads)."""

    id: str
    name: str
    default_project_id: str | None
    enabled: bool = True
    extra: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    password_changed_at: datetime


class Membership(KeelModel):
    """A user's roles in one project: those assigned and those they imply."""

    user: User
    project: Project
    #: Every role the user has there, implied ones included, by name.
    roles: tuple[Role, ...]

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(role.name for role in self.roles)


class IssuedToken(KeelModel):
    """A live token: who it authenticates, in which project, until when."""

    membership: Membership
    audit_id: str
    issued_at: datetime
    expires_at: datetime


class UserChanges(KeelModel):
    """What an update sets on a user: only the fields given (``model_fields_set``)."""

    name: str | None = None
    #: The new password's hash (the password itself never reaches the database layer).
    password_hash: str | None = None
    enabled: bool | None = None
    default_project_id: str | None = None
    #: Merged into the user's extra attributes.
    extra: dict[str, Any] | None = None


class ProjectChanges(KeelModel):
    """What an update sets on a project: only the fields given (``model_fields_set``)."""

    name: str | None = None
    description: str | None = None
    enabled: bool | None = None
    extra: dict[str, Any] | None = None
