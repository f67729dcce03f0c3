"""Public key checks and key generation."""

from __future__ import annotations

import pytest
from cryptography import x509

from services.api.resources.key_material import InvalidKey, fingerprint, generate
from shared.objects.key_pair import KeyPairType

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKyZymnQuOY/S4Sk68YlgH3Oxzf2Bp+IACeozsJtZbBO root@vm"


def test_ssh_fingerprint_is_what_ssh_keygen_shows() -> None:
    assert (
        fingerprint(KeyPairType.SSH, ED25519) == "27:9e:81:f7:0c:3e:4b:fa:d2:f6:36:a6:18:9d:c4:f8"
    )


@pytest.mark.parametrize(
    "key",
    [
        "",
        "ssh-rsa",
        "ssh-rsa AAAA",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKyZymnQuOY/S4Sk68YlgH3Oxzf2Bp+IACeozsJtZb",
        "ssh-foo AAAAC3NzaC1lZDI1NTE5AAAAIKyZymnQuOY/S4Sk68YlgH3Oxzf2Bp+IACeozsJtZbBO",
        "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----",
    ],
)
def test_malformed_ssh_keys_are_invalid(key: str) -> None:
    with pytest.raises(InvalidKey, match="failed to generate fingerprint"):
        fingerprint(KeyPairType.SSH, key)


def test_an_ssh_key_is_not_a_certificate() -> None:
    with pytest.raises(InvalidKey):
        fingerprint(KeyPairType.X509, ED25519)


def test_generated_ssh_key_is_importable_with_the_same_fingerprint() -> None:
    made = generate(KeyPairType.SSH, "alice")
    assert made.public_key.startswith("ssh-rsa ")
    assert made.fingerprint == fingerprint(KeyPairType.SSH, made.public_key)
    assert "PRIVATE KEY" in made.private_key


def test_generated_certificate_names_the_user() -> None:
    made = generate(KeyPairType.X509, "alice")
    cert = x509.load_pem_x509_certificate(made.public_key.encode())
    assert cert.subject.rfc4514_string() == "CN=alice"
    assert made.fingerprint == fingerprint(KeyPairType.X509, made.public_key)
    assert len(made.fingerprint.split(":")) == 20


@pytest.mark.parametrize("user_id", ["", "u" * 65, "u" * 300, "ü" * 70])
def test_an_x509_certificate_is_made_for_any_user_id(user_id: str) -> None:
    made = generate(KeyPairType.X509, user_id)
    cert = x509.load_pem_x509_certificate(made.public_key.encode())
    [cn] = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    assert 1 <= len(str(cn.value).encode()) <= 64
    assert user_id.startswith(str(cn.value)) or str(cn.value) == "keel-user"
