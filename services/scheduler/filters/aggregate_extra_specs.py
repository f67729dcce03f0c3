"""AggregateInstanceExtraSpecsFilter: a flavor's scoped extra specs match the metadata of
the host's aggregates.

Each extra spec ``aggregate_instance_extra_specs:KEY`` must be matched by a value the
host's aggregates give ``KEY``; a host without that key fails. Unscoped and otherwise
scoped specs (``hw:...``) are not matched here. A requirement is a value (equal to one
of the host's), or an operator as Nova writes them: ``s== V``, ``s!= V``, ``<in> V``
(a substring of one), ``<or> A <or> B`` (equal to one of them), ``== N`` / ``>= N`` /
``<= N`` (numbers).
"""

from __future__ import annotations

import logging

from shared.db.host_candidates import HostSql
from shared.objects.compute_node import HostState
from shared.objects.instance import RequestSpec

LOG = logging.getLogger(__name__)

SCOPE = "aggregate_instance_extra_specs:"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _compare(operator: str, wanted: str, value: str) -> bool:
    if operator == "s==":
        return value == wanted
    if operator == "s!=":
        return value != wanted
    if operator == "<in>":
        return wanted in value
    have, want = _number(value), _number(wanted)
    if have is None or want is None:
        return False
    if operator == "==":
        return have == want
    if operator == ">=":
        return have >= want
    return have <= want


def matches(requirement: str, values: list[str]) -> bool:
    """Whether one of ``values`` meets ``requirement``."""
    words = requirement.split()
    if words and words[0] == "<or>":
        choices = {w for w in words if w != "<or>"}
        return any(value in choices for value in values)
    if len(words) == 2 and words[0] in ("s==", "s!=", "<in>", "==", ">=", "<="):
        return any(_compare(words[0], words[1], value) for value in values)
    return requirement in values


class AggregateInstanceExtraSpecsFilter:
    name = "AggregateInstanceExtraSpecsFilter"

    def host_passes(self, host: HostState, spec: RequestSpec) -> bool:
        for key, requirement in spec.flavor.extra_specs.items():
            if not key.startswith(SCOPE):
                continue
            wanted = key.removeprefix(SCOPE)
            values = host.aggregate_metadata.get(wanted, [])
            if not values or not matches(requirement, values):
                LOG.debug(
                    "host %s: its aggregates give %s=%s, the flavor asks %r",
                    host.node.host,
                    wanted,
                    values,
                    requirement,
                )
                return False
        return True

    def sql_condition(self, spec: RequestSpec, sql: HostSql) -> str | None:
        return None
