"""The base of every keel model: strict about unknown fields, readable from asyncpg rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import asyncpg
from pydantic import BaseModel, ConfigDict


class KeelModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def from_row(cls, row: asyncpg.Record | Mapping[str, Any]) -> Self:
        """Build from an asyncpg ``Record``, ignoring columns the model does not name."""
        fields = cls.model_fields  # a computed class property: read it once
        return cls.model_validate({k: row[k] for k in row.keys() if k in fields})
