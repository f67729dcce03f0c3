"""Who may do what: named rules, with defaults an operator overrides in a YAML file.

A rule is a check string in the language of ``oslo.policy`` files, the subset keel
needs:

* ``""`` or ``@`` — anyone; ``!`` — no one;
* ``role:admin`` — the caller has that role;
* ``rule:admin_api`` — another rule holds;
* ``project_id:%(project_id)s`` / ``user_id:%(user_id)s`` — the caller's project or
  user is the target's (keel's targets are the caller's own, so these hold for callers
  with a project or user);
* ``is_admin:True``;
* combined with ``and``, ``or``, ``not`` and parentheses.

The file (``KEEL_API__POLICY_FILE``) maps rule names to check strings; rules it does not
name keep their defaults (:data:`DEFAULTS`). It is read once at start-up: a file that
cannot be read or parsed, or that names a rule that does not exist, stops keel-api with
a message saying why, rather than leaving a policy silently open.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

from services.api.http.faults import Forbidden
from shared.context import RequestContext
from shared.exceptions import ConfigError

ADMIN_API = "admin_api"
REQUESTED_DESTINATION = "compute:servers:create:requested_destination"
FORCED_HOST = "os_compute_api:servers:create:forced_host"
SHELVE_OFFLOAD = "os_compute_api:os-shelve:shelve_offload"
UNSHELVE_TO_HOST = "os_compute_api:os-shelve:unshelve_to_host"

#: The rules keel enforces and their defaults.
DEFAULTS: dict[str, str] = {
    ADMIN_API: "role:admin",
    #: ``host``/``hypervisor_hostname`` on server create (2.74): still filtered.
    REQUESTED_DESTINATION: "rule:admin_api",
    #: ``availability_zone="zone:host[:node]"`` on server create: skips the filters.
    FORCED_HOST: "rule:admin_api",
    #: ``shelveOffload``: offload a SHELVED server now.
    SHELVE_OFFLOAD: "rule:admin_api",
    #: ``unshelve`` with a ``host`` (2.91).
    UNSHELVE_TO_HOST: "rule:admin_api",
}

#: Other names accepted for a rule in a policy file.
ALIASES: dict[str, str] = {
    "os_compute_api:servers:create:requested_destination": REQUESTED_DESTINATION,
}

Check = Callable[[RequestContext], bool]


class PolicyError(ConfigError):
    """A policy file or rule that cannot be used: keel-api does not start."""


def _tokens(text: str) -> list[str]:
    """Words split on whitespace, with the parentheses that open or close them apart
    (those inside a check, as in ``%(project_id)s``, stay)."""
    tokens: list[str] = []
    for word in text.split():
        opening = len(word) - len(word.lstrip("("))
        tokens.extend("(" * opening)
        check = word[opening:]
        closing = 0
        while check.endswith(")") and check.count("(") < check.count(")"):
            check = check[:-1]
            closing += 1
        if check:
            tokens.append(check)
        tokens.extend(")" * closing)
    return tokens


class _Parser:
    """``or`` binds loosest, then ``and``, then ``not``; parentheses group."""

    def __init__(self, policy: Policy, rule: str, text: str) -> None:
        self.policy = policy
        self.rule = rule
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0

    def error(self, why: str) -> PolicyError:
        return PolicyError(f"policy rule {self.rule!r}: cannot read {self.text!r}: {why}")

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.error("it ends too early")
        self.index += 1
        return token

    def parse(self) -> Check:
        if not self.tokens:
            return lambda ctx: True
        check = self.either()
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek()!r}")
        return check

    def either(self) -> Check:
        parts = [self.both()]
        while self.peek() == "or":
            self.take()
            parts.append(self.both())
        return parts[0] if len(parts) == 1 else lambda ctx: any(p(ctx) for p in parts)

    def both(self) -> Check:
        parts = [self.negation()]
        while self.peek() == "and":
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else lambda ctx: all(p(ctx) for p in parts)

    def negation(self) -> Check:
        if self.peek() == "not":
            self.take()
            inner = self.negation()
            return lambda ctx: not inner(ctx)
        return self.atom()

    def atom(self) -> Check:
        token = self.take()
        if token == "(":
            inner = self.either()
            if self.take() != ")":
                raise self.error("a parenthesis is not closed")
            return inner
        return self.check(token)

    def check(self, token: str) -> Check:
        if token == "@":
            return lambda ctx: True
        if token == "!":
            return lambda ctx: False
        kind, sep, value = token.partition(":")
        if not sep:
            raise self.error(f"{token!r} is not a check (expected kind:value)")
        if kind == "role":
            role = value.lower()
            return lambda ctx: role in (r.lower() for r in ctx.roles)
        if kind == "rule":
            policy, name = self.policy, value
            if name not in policy.rule_names:
                raise self.error(f"it refers to the unknown rule {name!r}")
            return lambda ctx: policy.allows(name, ctx)
        if kind == "is_admin":
            wanted = value.lower() == "true"
            return lambda ctx: ctx.is_admin == wanted
        if kind == "project_id" and value == "%(project_id)s":
            return lambda ctx: ctx.project_id is not None
        if kind == "user_id" and value == "%(user_id)s":
            return lambda ctx: ctx.user_id is not None
        raise self.error(f"keel does not know the check {token!r}")


class Policy:
    """The rules in force: :data:`DEFAULTS`, overridden by the operator's file."""

    def __init__(self, overrides: Mapping[str, str] | None = None) -> None:
        texts = dict(DEFAULTS)
        for name, text in (overrides or {}).items():
            texts[ALIASES.get(name, name)] = text
        self.rule_names = frozenset(texts)
        self._texts = texts
        self._checks = {name: _Parser(self, name, text).parse() for name, text in texts.items()}
        for name in self._checks:
            self._check_no_cycle(name, ())

    def _check_no_cycle(self, name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise PolicyError(f"policy rules refer to each other in a loop: {' → '.join(path)}")
        for referred in re.findall(r"rule:([^\s()]+)", self._texts[name]):
            self._check_no_cycle(referred, (*path, name))

    @classmethod
    def load(cls, path: Path | None) -> Policy:
        """The defaults, overridden by the YAML file at ``path`` when one is given."""
        if path is None:
            return cls()
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise PolicyError(f"cannot read the policy file {path}: {exc}") from None
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise PolicyError(f"the policy file {path} must map rule names to check strings")
        overrides: dict[str, str] = {}
        for name, text in data.items():
            if not isinstance(name, str) or not isinstance(text, str):
                raise PolicyError(f"the policy file {path}: rule {name!r} must be a check string")
            known = ALIASES.get(name, name)
            if known not in DEFAULTS:
                raise PolicyError(
                    f"the policy file {path} names the unknown rule {name!r}; keel's rules "
                    f"are {', '.join(sorted(DEFAULTS))}"
                )
            overrides[name] = text
        return cls(overrides)

    def rule(self, name: str) -> str:
        """The check string in force for ``name``."""
        return self._texts[ALIASES.get(name, name)]

    def allows(self, name: str, ctx: RequestContext) -> bool:
        return self._checks[ALIASES.get(name, name)](ctx)

    def enforce(self, name: str, ctx: RequestContext) -> None:
        """403 with Nova's message unless the rule holds for the caller."""
        if not self.allows(name, ctx):
            raise Forbidden(f"Policy doesn't allow {name} to be performed.")
