"""The ranges PostgreSQL's integer columns hold, for request models to validate against.

A number outside its column's range must be a 400 that names the field, never an error
from the database driver. ``Int4`` fields are stored in ``INTEGER`` columns.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

INT4_MAX = 2**31 - 1
INT8_MIN = -(2**63)
INT8_MAX = 2**63 - 1

#: A count or size stored in an ``INTEGER`` column: 0 up to 2,147,483,647.
Int4 = Annotated[int, Field(ge=0, le=INT4_MAX)]
#: The same, at least 1.
PositiveInt4 = Annotated[int, Field(ge=1, le=INT4_MAX)]
