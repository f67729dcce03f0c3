"""The base of every keel model: tolerant of unknown fields, readable from asyncpg rows.

Messages and stored JSON written by a newer release may carry fields this one does not
know; they are ignored (see the compatibility rules in :mod:`shared.rpc`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import asyncpg
from pydantic import BaseModel, ConfigDict


class KeelModel(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @classmethod
    def from_row(cls, row: asyncpg.Record | Mapping[str, Any]) -> Self:
        """Build from an asyncpg ``Record``, ignoring columns the model does not name."""
        fields = cls.model_fields  # a computed class property: read it once
        return cls.model_validate({k: row[k] for k in row.keys() if k in fields})
