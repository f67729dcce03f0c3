"""Static tokens and the contexts they stand for."""

from __future__ import annotations

from services.api.http.auth import context_for, find_token
from shared.config import AuthSettings, TokenInfo

AUTH = AuthSettings(
    tokens={
        "admin-secret": TokenInfo(user_id="root", project_id="ops", roles=["admin", "member"]),
        "member-secret": TokenInfo(user_id="alice", project_id="team"),
    }
)


def test_known_token_is_found() -> None:
    info = find_token(AUTH, "member-secret")
    assert info is not None
    assert info.user_id == "alice"


def test_unknown_or_partial_token_is_not_found() -> None:
    assert find_token(AUTH, "member") is None
    assert find_token(AUTH, "member-secret ") is None
    assert find_token(AuthSettings(), "anything") is None


def test_context_carries_identity_and_request_id() -> None:
    info = find_token(AUTH, "admin-secret")
    assert info is not None
    ctx = context_for(info, "req-1")
    assert ctx.request_id == "req-1"
    assert (ctx.user_id, ctx.project_id) == ("root", "ops")
    assert ctx.is_admin


def test_members_are_not_admins() -> None:
    info = find_token(AUTH, "member-secret")
    assert info is not None
    assert not context_for(info, "req-2").is_admin


def test_any_text_a_header_can_carry_is_compared_safely() -> None:
    for given in ("", "admin-secret\x00", "ädmin-secret", "a" * 10_000):
        assert find_token(AUTH, given) is None
