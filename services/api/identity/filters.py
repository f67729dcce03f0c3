"""Query strings of the identity API, read as Keystone reads them."""

from __future__ import annotations

from fastapi import Request

from shared.objects.identity import DEFAULT_DOMAIN_ID, DEFAULT_DOMAIN_NAME

_FALSE = {"0", "false", "f", "no", "n", "off"}


def flag(request: Request, name: str) -> bool:
    """``?effective``, ``?include_names``: true when present, unless ``0`` or ``false``."""
    value = request.query_params.get(name)
    return value is not None and value.strip().lower() not in _FALSE


def enabled(request: Request) -> bool | None:
    """The ``enabled`` filter: None when absent."""
    value = request.query_params.get("enabled")
    if value is None:
        return None
    return value.strip().lower() not in _FALSE


def other_domain(request: Request) -> bool:
    """True when ``domain_id`` names a domain other than keel's one (nothing matches)."""
    domain_id = request.query_params.get("domain_id")
    return domain_id is not None and domain_id not in (DEFAULT_DOMAIN_ID, DEFAULT_DOMAIN_NAME)


def self_url(request: Request) -> str:
    return str(request.url)
