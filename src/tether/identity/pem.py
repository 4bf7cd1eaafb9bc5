"""Reading and writing the PKI's PEM files, with errors that name the file.

Used by the CLI (``tether identity create-* / inspect``) and by the issuer loader of the
identity service.  Private keys are written with mode 0600.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644


class PemError(Exception):
    """A PEM file is missing, unreadable or holds the wrong thing; the message names the file."""


def parse_certificates(data: bytes, source: str) -> list[x509.Certificate]:
    """Every certificate in ``data`` (PEM, or a single DER certificate), leaf first as written."""
    try:
        if b"-----BEGIN" in data:
            return x509.load_pem_x509_certificates(data)
        return [x509.load_der_x509_certificate(data)]
    except ValueError as exc:
        raise PemError(f"{source}: no readable X.509 certificate ({exc})") from None


def parse_private_key(data: bytes, source: str) -> PrivateKeyTypes:
    """An unencrypted PEM (PKCS#8 or SEC1) or DER PKCS#8 private key."""
    try:
        if b"-----BEGIN" in data:
            return serialization.load_pem_private_key(data, password=None)
        return serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise PemError(f"{source}: no readable unencrypted private key ({exc})") from None


def read_certificates(path: Path) -> list[x509.Certificate]:
    """The certificates of a PEM file; at least one, else ``PemError`` naming ``path``."""
    return parse_certificates(read_bytes(path), str(path))


def read_private_key(path: Path) -> PrivateKeyTypes:
    return parse_private_key(read_bytes(path), str(path))


def certificate_pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_file(path: Path, data: bytes, *, private: bool) -> None:
    """Write ``data`` to ``path`` atomically: readers see the old file or the new one, never half.

    The temporary file is created 0600 before any byte is written, so a key is never readable by
    others even for an instant; public files are then opened up to 0644.
    """
    if not path.parent.is_dir():
        raise PemError(f"{path}: directory {path.parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates it 0600
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, PRIVATE_MODE if private else PUBLIC_MODE)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise PemError(f"{path}: cannot write ({exc.strerror})") from None


def read_bytes(path: Path) -> bytes:
    """The non-empty content of ``path``, else ``PemError`` naming it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PemError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise PemError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise PemError(f"{path}: cannot read ({exc.strerror})") from None
    if not data.strip():
        raise PemError(f"{path}: file is empty")
    return data
