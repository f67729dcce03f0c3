"""Who may use the identity admin API, as Keystone's default policies say.

Creating, changing and deleting projects, users, roles and role assignments, and
listing roles and assignments, need the admin role. Anyone else sees only themselves:
their own user, the project their token is scoped to, their own roles and assignments.
A refusal is Keystone's 403, naming the action.
"""

from __future__ import annotations

from services.api.http.faults import Forbidden
from shared.context import RequestContext


def refused(action: str) -> Forbidden:
    return Forbidden(f"You are not authorized to perform the requested action: identity:{action}.")


def admin(ctx: RequestContext, action: str) -> None:
    """403 unless the caller is an admin."""
    if not ctx.is_admin:
        raise refused(action)


def admin_or_self(ctx: RequestContext, user_id: str, action: str) -> None:
    """403 unless the caller is an admin or the user ``user_id``."""
    if not ctx.is_admin and user_id != ctx.user_id:
        raise refused(action)


def admin_or_own_project(ctx: RequestContext, project_id: str, action: str) -> None:
    """403 unless the caller is an admin or their token is scoped to ``project_id``."""
    if not ctx.is_admin and project_id != ctx.project_id:
        raise refused(action)
