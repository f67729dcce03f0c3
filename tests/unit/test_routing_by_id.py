"""Routing and ownership follow ids, never host names — except where this file says so.

Instances reach their agent by Instance → ComputeNode (``compute_id``) → Service
(``service_id``) → ``compute.<service uuid>``. This test reads every module of
``services`` and ``shared`` and finds each place that *matches* on a host or node name:
an SQL predicate (``host = ...``, ``node = ...``, ``hypervisor_hostname = ...`` outside a
``SET`` list) or a Python comparison of a ``.host``/``.node`` attribute. Each must be in
:data:`ALLOWED`, with the reason it is not routing or ownership. A new one fails here
until it is made to use ids, or is added with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: (module, function) → why matching on a name is right there.
ALLOWED: dict[tuple[str, str], str] = {
    ("shared/db/placement.py", "legacy_node_id_sql"): (
        "the one named fallback: rows an older release wrote have no compute_id yet"
    ),
    ("shared/db/backfills.py", "<module>"): (
        "the backfills that turn names into ids (the node of an unlinked instance comes "
        "from placement's fallback; a node's service from its host)"
    ),
    ("shared/db/instances.py", "set_scheduled"): (
        "a compare-and-swap guard: a repeated build is recognised by the same placement, "
        "the compute_id included"
    ),
    ("shared/db/services.py", "get_or_create"): (
        "registration: the service row of the host an agent says it is (after the identity "
        "checks), and the key of services' uniqueness"
    ),
    ("shared/db/services.py", "find_compute"): (
        "identity resolution and rename: what the database knows about a host name"
    ),
    ("shared/db/services.py", "list_services"): (
        "the operator's ?host= filter of os-services and keel-manage service list"
    ),
    ("shared/db/service_maintenance.py", "<module>"): (
        "rename: the service an operator names by its host"
    ),
    ("shared/db/service_maintenance.py", "rename_compute"): (
        "rename itself: the new name must be free, and unlinked rows carry only the old name"
    ),
    ("services/api/resources/external_events.py", "_answer"): (
        "whether the server was placed at all (a host recorded), as Nova's 422 for an "
        "event without a host to go to; nothing is sent to any host"
    ),
    ("services/api/servers/soft_delete.py", "soft_deletable"): (
        "whether the server was placed at all (a host recorded), not which host: its agent "
        "is then found by id (host_service)"
    ),
    ("services/conductor/compute_identity.py", "_known_node"): (
        "identity resolution compares the agent's host with the node's service host"
    ),
    ("services/conductor/compute_identity.py", "_check_hypervisor_free"): (
        "identity resolution: does a new host's hypervisor already hold servers?"
    ),
    ("services/conductor/registration.py", "_record_node"): (
        "noticing that a node's hypervisor host name changed, to log old → new"
    ),
    ("services/conductor/agent_authorisation.py", "AgentGuard.host"): (
        "the host an agent's credentials were issued for, compared with the host it says it "
        "is before it registers (identity, not routing)"
    ),
    ("shared/db/agent_users.py", "issue"): (
        "keel-manage agent credentials HOST: the service an operator names by its host"
    ),
    ("shared/db/compute_nodes.py", "named"): (
        "an admin's requested destination is given by name; it is resolved to node ids "
        "once, in keel-api, and followed by id from there"
    ),
    ("services/api/servers/requested_destination.py", "ZoneRequest.forced"): (
        "whether availability_zone names a forced host or node at all (not a match)"
    ),
    ("services/scheduler/filters/ignore_hosts.py", "IgnoreHostsFilter.host_passes"): (
        "request specs of an older release name hosts to ignore (logged)"
    ),
    ("shared/db/orphans.py", "list_all"): (
        "keel-manage compute orphans --host: the operator names the host to list"
    ),
    ("shared/db/services.py", "list_with_zones"): ("the operator's ?host= filter of os-services"),
    ("shared/db/services.py", "counted_version"): (
        "a service's own row is (host, binary): the version it stamped there before"
    ),
    ("shared/db/services.py", "minimum_of_the_rest"): (
        "a service's own row is (host, binary): left out of the versions it is compared with"
    ),
}

SOURCES = ("services", "shared")

_SET_CLAUSE = re.compile(r"\bSET\b.*?(?=\bWHERE\b|\bFROM\b|\bRETURNING\b|$)", re.S)
_NAME_PREDICATE = re.compile(
    r"(?<![\w.])(?:\w+\.)?(host|node|hypervisor_hostname)\s*"
    r"(=|<>|!=|~|\bLIKE\b|\bIN\b|\bIS\s+(NOT\s+)?DISTINCT\s+FROM\b)"
)
_SQL = re.compile(r"\b(SELECT|UPDATE|DELETE|WHERE)\b")
_NAME_ATTRS = {"host", "node", "hypervisor_hostname"}


def _sql_text(node: ast.AST) -> str | None:
    """The text of a string literal or f-string (placeholders dropped)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    return None


def _matches_names(sql: str) -> bool:
    if not _SQL.search(sql):
        return False
    return bool(_NAME_PREDICATE.search(_SET_CLAUSE.sub(" ", sql)))


def _compares_names(node: ast.Compare) -> bool:
    sides = [node.left, *node.comparators]
    return any(isinstance(s, ast.Attribute) and s.attr in _NAME_ATTRS for s in sides)


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: set[str] = set()

    def _enter(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _enter

    def _here(self) -> str:
        return ".".join(self.scope) or "<module>"

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        text = _sql_text(node)
        if text is not None and _matches_names(text):
            self.found.add(self._here())

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        text = _sql_text(node)
        if text is not None and _matches_names(text):
            self.found.add(self._here())
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if _compares_names(node):
            self.found.add(self._here())
        self.generic_visit(node)


def name_matches() -> set[tuple[str, str]]:
    found = set()
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            finder = _Finder()
            finder.visit(ast.parse(path.read_text(encoding="utf-8")))
            module = str(path.relative_to(ROOT))
            found |= {(module, where) for where in finder.found}
    return found


def test_no_routing_or_ownership_query_matches_on_a_host_name() -> None:
    unexpected = sorted(name_matches() - set(ALLOWED))
    assert unexpected == [], (
        "these match on a host or node name; route by compute_id / service_id instead "
        "(see shared/db/placement.py), or add them to ALLOWED with the reason"
    )


def test_every_allowed_exception_still_exists() -> None:
    assert sorted(set(ALLOWED) - name_matches()) == []


def test_the_finder_catches_what_it_is_for() -> None:
    assert _matches_names("SELECT * FROM compute_nodes WHERE host = $1 AND node = $2")
    assert _matches_names("SELECT 1 FROM instances i WHERE i.host IS DISTINCT FROM $2")
    assert not _matches_names("UPDATE instances SET host = $2 WHERE compute_id = $1")
    assert not _matches_names("SELECT * FROM instances WHERE compute_id = $1")
    assert _compares_names(ast.parse("a.host == b.host", mode="eval").body)  # type: ignore[arg-type]
