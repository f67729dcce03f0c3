"""Password hashes: salted, verifiable, never the password itself."""

from __future__ import annotations

import pytest

from shared.passwords import MAX_LENGTH, decoy_hash, hash_password, verify_password


def test_a_hash_verifies_its_password_only() -> None:
    stored = hash_password("correct horse")
    assert stored.startswith("scrypt$")
    assert "correct horse" not in stored
    assert verify_password("correct horse", stored)
    assert not verify_password("correct horse!", stored)
    assert not verify_password("", stored)


def test_each_hash_has_its_own_salt() -> None:
    assert hash_password("same") != hash_password("same")


@pytest.mark.parametrize("stored", ["", "plain", "md5$abc", "scrypt$x$y$z$a$b", decoy_hash()])
def test_malformed_or_decoy_hashes_match_nothing(stored: str) -> None:
    assert not verify_password("anything", stored)


@pytest.mark.parametrize("password", ["", "x" * (MAX_LENGTH + 1)])
def test_unusable_passwords_are_refused(password: str) -> None:
    with pytest.raises(ValueError, match="password"):
        hash_password(password)
