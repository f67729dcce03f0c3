"""Request bodies of the identity admin API, as Keystone's v3 API takes them.

Attributes Keystone defines are checked here; any other attribute of a project, user or
role (``email``, ``description`` of a user...) is kept as given and shown back, as
Keystone keeps them. keel has one domain and no project hierarchy, so a body naming
another domain, a parent project or a domain-specific role is refused with a message
saying so.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from services.api.http.faults import BadRequest
from shared.objects.identity import DEFAULT_DOMAIN_ID, DEFAULT_DOMAIN_NAME, ProjectChanges
from shared.passwords import MAX_LENGTH as MAX_PASSWORD

#: Keystone's limits on names.
ProjectName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"\S")]
UserName = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"\S")]
RoleName = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"\S")]
Password = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PASSWORD)]
Description = Annotated[str, StringConstraints(max_length=65535)]
#: The largest extra attribute keel keeps, as JSON text.
MAX_EXTRA_BYTES = 16384


class _Open(BaseModel):
    """Known attributes checked; others kept in ``model_extra``."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _bounded_extras(self) -> _Open:
        if len(repr(self.model_extra or {})) > MAX_EXTRA_BYTES:
            raise ValueError(f"extra attributes are limited to {MAX_EXTRA_BYTES} characters")
        return self

    def extras(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class _Closed(BaseModel):
    model_config = ConfigDict(extra="ignore")


def check_domain(domain_id: str | None) -> None:
    """400 unless ``domain_id`` is absent or names the default domain."""
    if domain_id is not None and domain_id not in (DEFAULT_DOMAIN_ID, DEFAULT_DOMAIN_NAME):
        raise BadRequest(
            f"keel has one domain, {DEFAULT_DOMAIN_ID!r}: domain_id {domain_id!r} cannot be used."
        )


def check_no_options(options: dict[str, Any] | None) -> None:
    if options:
        raise BadRequest(f"keel supports no identity options: {', '.join(sorted(options))}.")


class ProjectCreate(_Open):
    name: ProjectName
    description: Description | None = None
    domain_id: str | None = None
    enabled: bool = True
    is_domain: bool = False
    parent_id: str | None = None
    options: dict[str, Any] | None = None

    def check(self) -> None:
        check_domain(self.domain_id)
        check_no_options(self.options)
        if self.is_domain:
            raise BadRequest("keel has one domain: a project cannot be a domain (is_domain).")
        if self.parent_id not in (None, DEFAULT_DOMAIN_ID):
            raise BadRequest("keel has no project hierarchy: parent_id must be the domain.")


class ProjectUpdate(_Open):
    name: ProjectName | None = None
    description: Description | None = None
    enabled: bool | None = None
    domain_id: str | None = None
    options: dict[str, Any] | None = None

    def changes(self) -> ProjectChanges:
        check_domain(self.domain_id)
        check_no_options(self.options)
        known = self.model_dump(include={"name", "description", "enabled"}, exclude_unset=True)
        extra = self.extras()
        if extra:
            known["extra"] = extra
        return ProjectChanges(**known)


class UserCreate(_Open):
    name: UserName
    password: Password | None = None
    default_project_id: str | None = None
    domain_id: str | None = None
    enabled: bool = True
    options: dict[str, Any] | None = None

    def check(self) -> None:
        check_domain(self.domain_id)
        check_no_options(self.options)


class UserUpdate(_Open):
    name: UserName | None = None
    password: Password | None = None
    default_project_id: str | None = None
    domain_id: str | None = None
    enabled: bool | None = None
    options: dict[str, Any] | None = None

    def check(self) -> None:
        check_domain(self.domain_id)
        check_no_options(self.options)


class RoleCreate(_Open):
    name: RoleName
    description: Description | None = None
    domain_id: str | None = None
    options: dict[str, Any] | None = None

    def check(self) -> None:
        check_no_options(self.options)
        if self.domain_id is not None:
            raise BadRequest("keel has no domain-specific roles: domain_id must be null.")


class RoleUpdate(RoleCreate):
    name: RoleName | None = None  # type: ignore[assignment]


class PasswordChange(_Closed):
    password: Password
    original_password: str = Field(max_length=4096)


class ProjectBody(_Closed):
    project: ProjectCreate


class ProjectPatch(_Closed):
    project: ProjectUpdate


class UserBody(_Closed):
    user: UserCreate


class UserPatch(_Closed):
    user: UserUpdate


class RoleBody(_Closed):
    role: RoleCreate


class RolePatch(_Closed):
    role: RoleUpdate


class PasswordBody(_Closed):
    user: PasswordChange
