"""Identity API bodies: versions, domains, projects, users, roles, tokens and the catalog.

A project, user or role shows the extra attributes it was given (``email``,
``description``...) beside those Keystone defines, as Keystone does.
"""

from __future__ import annotations

import functools
import uuid
from datetime import UTC, datetime
from typing import Any

from services.api.http.links import Links
from shared.objects.identity import (
    DEFAULT_DOMAIN_ID,
    DEFAULT_DOMAIN_NAME,
    IssuedToken,
    Project,
    Role,
    User,
)

VERSION_ID = "v3.14"
VERSION_UPDATED = "2020-04-07T00:00:00Z"
MEDIA_TYPE = "application/vnd.openstack.identity-v3+json"
#: Names the catalog gives the services keel-api serves, by service type.
SERVICE_NAMES = {
    "compute": "nova",
    "image": "glance",
    "identity": "keystone",
    "network": "neutron",
}
INTERFACES = ("public", "internal", "admin")
_IDS = uuid.UUID("6b65656c-0000-4000-8000-000000000000")


@functools.lru_cache(maxsize=1024)
def stable_id(*parts: str) -> str:
    """The same id for the same name on every keel (roles, services, endpoints).

    Remembered: every login's catalog asks for the same sixteen."""
    return uuid.uuid5(_IDS, "/".join(parts)).hex


def identity_url(links: Links) -> str:
    return links.bookmark("identity", "v3") + "/"


def version(links: Links) -> dict[str, Any]:
    return {
        "id": VERSION_ID,
        "status": "stable",
        "updated": VERSION_UPDATED,
        "links": [{"rel": "self", "href": identity_url(links)}],
        "media-types": [{"base": "application/json", "type": MEDIA_TYPE}],
    }


def timestamp(value: datetime) -> str:
    """``2024-05-01T12:00:00.000000Z``, as identity tokens write their times."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def domain(links: Links) -> dict[str, Any]:
    return {
        "id": DEFAULT_DOMAIN_ID,
        "name": DEFAULT_DOMAIN_NAME,
        "description": "The only domain of keel.",
        "enabled": True,
        "tags": [],
        "options": {},
        "links": {"self": links.bookmark("identity", "v3", "domains", DEFAULT_DOMAIN_ID)},
    }


def domain_ref() -> dict[str, str]:
    return {"id": DEFAULT_DOMAIN_ID, "name": DEFAULT_DOMAIN_NAME}


def _self_link(links: Links, collection: str, item_id: str) -> dict[str, str]:
    return {"self": links.bookmark("identity", "v3", collection, item_id)}


def project(item: Project, links: Links) -> dict[str, Any]:
    return {
        "tags": [],
        **item.extra,
        "id": item.id,
        "name": item.name,
        "description": item.description,
        "domain_id": DEFAULT_DOMAIN_ID,
        "parent_id": DEFAULT_DOMAIN_ID,
        "enabled": item.enabled,
        "is_domain": False,
        "options": {},
        "links": _self_link(links, "projects", item.id),
    }


def user(item: User, links: Links) -> dict[str, Any]:
    shown: dict[str, Any] = {
        **item.extra,
        "id": item.id,
        "name": item.name,
        "domain_id": DEFAULT_DOMAIN_ID,
        "enabled": item.enabled,
        "password_expires_at": None,
        "options": {},
        "links": _self_link(links, "users", item.id),
    }
    if item.default_project_id is not None:
        shown["default_project_id"] = item.default_project_id
    return shown


def role(item: Role, links: Links) -> dict[str, Any]:
    return {
        **item.extra,
        "id": item.id,
        "name": item.name,
        "domain_id": None,
        "description": item.description,
        "options": {},
        "links": _self_link(links, "roles", item.id),
    }


def collection(key: str, items: list[dict[str, Any]], self_url: str) -> dict[str, Any]:
    return {key: items, "links": {"self": self_url, "previous": None, "next": None}}


def catalog(links: Links, region: str) -> list[dict[str, Any]]:
    """The compute, image, identity and network services, each at the address the client
    used."""
    urls = {
        "compute": links.compute() + "/",
        "image": links.bookmark("image") + "/",
        "identity": links.bookmark("identity"),
        "network": links.bookmark("network") + "/",
    }
    services = []
    for service_type, url in urls.items():
        endpoints = [
            {
                "id": stable_id("endpoint", service_type, interface),
                "interface": interface,
                "region": region,
                "region_id": region,
                "url": url,
            }
            for interface in INTERFACES
        ]
        services.append(
            {
                "id": stable_id("service", service_type),
                "type": service_type,
                "name": SERVICE_NAMES[service_type],
                "endpoints": endpoints,
            }
        )
    return services


def token(issued: IssuedToken, links: Links, region: str) -> dict[str, Any]:
    membership = issued.membership
    return {
        "token": {
            "methods": ["password"],
            "audit_ids": [issued.audit_id],
            "issued_at": timestamp(issued.issued_at),
            "expires_at": timestamp(issued.expires_at),
            "is_domain": False,
            "user": {
                "id": membership.user.id,
                "name": membership.user.name,
                "domain": domain_ref(),
                "password_expires_at": None,
            },
            "project": {
                "id": membership.project.id,
                "name": membership.project.name,
                "domain": domain_ref(),
            },
            "roles": [{"id": r.id, "name": r.name} for r in membership.roles],
            "catalog": catalog(links, region),
        }
    }
