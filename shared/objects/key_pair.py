"""A row of ``key_pairs``: a public key a user registered (or had generated) by name."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from shared.objects.base import KeelModel


class KeyPairType(StrEnum):
    SSH = "ssh"
    X509 = "x509"


class KeyPair(KeelModel):
    id: int
    user_id: str
    name: str
    type: KeyPairType
    public_key: str
    fingerprint: str
    created_at: datetime
