"""Checking imported public keys and generating new key pairs.

An ``ssh`` public key must parse as an OpenSSH public key (RSA, ECDSA, Ed25519...); its
fingerprint is the colon-separated MD5 of the key blob, as ``ssh-keygen -l -E md5``
shows it. An ``x509`` public key is a PEM certificate; its fingerprint is the
colon-separated SHA-1 of the certificate. Generation makes a 2048-bit RSA key: for
``ssh`` the public half in OpenSSH form, for ``x509`` a self-signed client certificate.
Generating takes tens of milliseconds; callers run it in a thread.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.objects.key_pair import KeyPairType

RSA_BITS = 2048
CERTIFICATE_DAYS = 3650
GENERATED_COMMENT = "Generated-by-keel"


class InvalidKey(ValueError):
    """The public key cannot be used; the message says why."""


@dataclass(frozen=True)
class NewKeyPair:
    public_key: str
    private_key: str
    fingerprint: str


def _colons(hex_digest: str) -> str:
    return ":".join(hex_digest[i : i + 2] for i in range(0, len(hex_digest), 2))


def ssh_fingerprint(public_key: str) -> str:
    """The MD5 fingerprint of an OpenSSH public key; :class:`InvalidKey` if it is not one."""
    try:
        serialization.load_ssh_public_key(public_key.encode("utf-8"))
        blob = base64.b64decode(public_key.split()[1], validate=True)
    except (ValueError, IndexError, UnicodeError, UnsupportedAlgorithm) as exc:
        raise InvalidKey(
            f"failed to generate fingerprint: not an OpenSSH public key ({exc})"
        ) from None
    return _colons(hashlib.md5(blob, usedforsecurity=False).hexdigest())


def x509_fingerprint(certificate: str) -> str:
    """The SHA-1 fingerprint of a PEM certificate; :class:`InvalidKey` if it is not one."""
    try:
        cert = x509.load_pem_x509_certificate(certificate.encode("utf-8"))
    except (ValueError, UnicodeError) as exc:
        raise InvalidKey(f"failed to generate fingerprint: not a PEM certificate ({exc})") from None
    return _colons(cert.fingerprint(hashes.SHA1()).hex())


def fingerprint(key_type: KeyPairType, public_key: str) -> str:
    if key_type is KeyPairType.X509:
        return x509_fingerprint(public_key)
    return ssh_fingerprint(public_key)


def _private_pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode("ascii")


#: X.509 bounds a common name to 64 (RFC 5280's ub-common-name); the library counts
#: its UTF-8 bytes.
MAX_COMMON_NAME = 64
#: The subject of a certificate made for a user whose id is empty.
NAMELESS = "keel-user"


def common_name(subject_name: str) -> str:
    """``subject_name`` as a certificate's common name: 1 to 64 bytes of UTF-8, always."""
    encoded = subject_name.encode("utf-8", "replace")[:MAX_COMMON_NAME]
    return encoded.decode("utf-8", "ignore") or NAMELESS


def _certificate(key: rsa.RSAPrivateKey, subject_name: str) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name(subject_name))])
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )


def generate(key_type: KeyPairType, subject_name: str) -> NewKeyPair:
    """A new key pair; ``subject_name`` (the user) names an x509 certificate's subject."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    if key_type is KeyPairType.X509:
        cert = _certificate(key, subject_name)
        public = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    else:
        openssh = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        public = f"{openssh.decode('ascii')} {GENERATED_COMMENT}"
    return NewKeyPair(
        public_key=public, private_key=_private_pem(key), fingerprint=fingerprint(key_type, public)
    )
