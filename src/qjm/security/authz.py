"""Who may do what to which journal: identities (from verified client certificates) mapped to roles
per journal. Design §9.2.

Three roles. ``reader`` reads: journal state, manifests, edits, segment downloads, status.
``writer`` also fences, writes and recovers (new_epoch, start/finalize, prepare/accept recovery,
data-plane frames). ``admin`` also formats and purges. Each role is granted per journal id, ``*``
standing for every journal; a grant of ``writer`` or ``admin`` includes ``reader`` on the same
journals. A node's config gives the grants in its ``[authz]`` table::

    [authz]
    "alice" = { writer = ["orders"], reader = ["*"] }
    "ops"   = { admin = ["*"] }
    "jn1"   = { reader = ["*"] }     # the other nodes, for recovery downloads

The node checks every request against them; a refusal is a ``PermissionDeniedError``. A node with
TLS and no ``[authz]`` table lets every certificate its CA signed do everything (authentication
alone); a node without TLS has no identities and allows everything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from qjm.errors import ConfigError, PermissionDeniedError

log = logging.getLogger("qjm.authz")

READER: Final = "reader"
WRITER: Final = "writer"
ADMIN: Final = "admin"
ROLES: Final = (READER, WRITER, ADMIN)
ANY_JOURNAL: Final = "*"
# A role granted on a journal also grants these there.
_IMPLIES: Final = {READER: (READER,), WRITER: (WRITER, READER), ADMIN: (ADMIN, READER)}

OnDenied = Callable[[str, str, str], None]
"""Told ``(identity, journal_id, role)`` of each refusal (metrics)."""


@dataclass(frozen=True, slots=True)
class Authorizer:
    """The grants of one node. ``grants`` None: no ``[authz]`` table, every identity may do everything."""

    grants: Mapping[str, Mapping[str, frozenset[str]]] | None = None  # identity -> role -> journal ids
    on_denied: list[OnDenied] = field(default_factory=list, compare=False)

    @property
    def enforcing(self) -> bool:
        return self.grants is not None

    def allowed(self, identity: str | None, journal_id: str, role: str) -> bool:
        """True if ``identity`` holds ``role`` on ``journal_id``. None (no TLS, so no identity) is allowed."""
        if identity is None or self.grants is None:
            return True
        journals = self.grants.get(identity, {}).get(role, frozenset())
        return journal_id in journals or ANY_JOURNAL in journals

    def check(self, identity: str | None, journal_id: str, role: str) -> None:
        """Raise ``PermissionDeniedError`` (logged, and told to ``on_denied``) unless allowed."""
        assert role in ROLES, role
        if self.allowed(identity, journal_id, role):
            return
        log.warning("refused %r the %s role on journal %r", identity, role, journal_id)
        for fn in self.on_denied:
            fn(identity or "", journal_id, role)
        raise PermissionDeniedError(f"identity {identity!r} has no {role} role on journal {journal_id!r}", role=role)


def authorizer_from(table: Any, where: str) -> Authorizer:
    """The ``Authorizer`` of an ``[authz]`` table (identity -> {role -> [journal ids]}), checked:
    an unknown role, or journals that are not a list of strings, is an error naming the entry."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a table of identities")
    grants: dict[str, dict[str, frozenset[str]]] = {}
    for identity, roles in table.items():
        here = f"{where} {identity!r}"
        if not isinstance(identity, str) or not identity:
            raise ConfigError(f"{here}: an identity must be a non-empty string")
        if not isinstance(roles, Mapping):
            raise ConfigError(f'{here}: expected a table of roles, e.g. {{ writer = ["orders"], reader = ["*"] }}')
        out: dict[str, set[str]] = {}
        for role, journals in roles.items():
            if role not in ROLES:
                raise ConfigError(f"{here}: unknown role {role!r} (known: {', '.join(ROLES)})")
            if not isinstance(journals, list) or not all(isinstance(j, str) and j for j in journals):
                raise ConfigError(f'{here} {role}: expected a list of journal ids or "*", got {journals!r}')
            for implied in _IMPLIES[role]:
                out.setdefault(implied, set()).update(journals)
        grants[identity] = {r: frozenset(js) for r, js in out.items()}
    return Authorizer(grants)
