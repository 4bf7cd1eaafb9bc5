"""The proxy's key, CSR and certificate checks, for a short-lived child of the proxy (``answer``).

``cryptography`` (which they need) is about 12 MB of resident memory once
loaded, and a loaded extension module is never unloaded; the serving proxy
(``io.identity_client.CertifyChild``, for ``io.identity_client`` and
``io.spire_client``) runs ``python -m tether.proxy.certify`` as a child for
each certificate round (``main``: one JSON request per line on stdin, one
answer per line on stdout, until stdin closes), and holds only what ``ssl``
takes. Requests and answers are JSON-ready dicts (binary as base64, times as
ISO 8601):

- ``{"op": "new", "name": N, "password": HEX}``: a new P-256 key and a DER
  CSR for the DNS name ``N`` (``csr``);
- ``{"op": "check", "key": PEM, "password": HEX, "name": N, "anchors": PEM,
  "leaf": B64, "intermediates": [B64], "valid_until": ISO|null, "now": ISO}``:
  a Certify answer for that key (``core.certs.check_certified``);
- ``{"op": "svid", "chain": B64, "key_der": B64, "password": HEX,
  "spiffe_id": ID, "anchors": PEM, "now": ISO}``: a SPIRE X.509-SVID and its
  key (``core.certs.check_svid``).

Each answers the key as PKCS#8 PEM encrypted with ``password`` (``key``,
what the proxy hands ``ssl`` through a memfd; never in the clear);
``check`` and ``svid`` also the chain as PEM
(``chain``) and when it expires (``valid_until``), or ``{"error": why}``.
The key goes through a pipe between the proxy and its child only; it never
touches a disk.
"""

from __future__ import annotations

import base64
import json
import sys
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from tether.proxy.core import certs
from tether.proxy.core.certified import CertError, Certified


def answer(request: dict[str, Any]) -> dict[str, Any]:
    password = bytes.fromhex(request["password"])
    op = request["op"]
    if op == "new":
        made = certs.new_key()
        return {**_key_pems(made, password), "csr": _b64(certs.csr_der(made, request["name"]))}
    anchors = certs.parse_anchors(request["anchors"].encode())
    now = datetime.fromisoformat(request["now"])
    key: PrivateKeyTypes
    try:
        if op == "check":
            loaded = serialization.load_pem_private_key(request["key"].encode(), password)
            if not isinstance(loaded, ec.EllipticCurvePrivateKey):
                raise CertError("the key is not a P-256 key")
            valid_until = request["valid_until"]
            certified = certs.check_certified(
                base64.b64decode(request["leaf"]), [base64.b64decode(d) for d in request["intermediates"]],
                datetime.fromisoformat(valid_until) if valid_until else None,
                key=loaded, name=request["name"], anchors=anchors, now=now)
            key = loaded
        elif op == "svid":
            certified, key = certs.check_svid(base64.b64decode(request["chain"]), base64.b64decode(request["key_der"]),
                                              spiffe_id=request["spiffe_id"], anchors=anchors, now=now)
        else:
            raise ValueError(f"unknown op {op!r}")
    except CertError as exc:
        return {"error": str(exc)}
    return {**_key_pems(key, password), **_certified(certified)}


def _key_pems(key: PrivateKeyTypes, password: bytes) -> dict[str, str]:
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(password))
    return {"key": encrypted.decode()}


def _certified(certified: Certified) -> dict[str, str]:
    return {"chain": certified.chain_pem.decode(), "valid_until": certified.valid_until.isoformat()}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def main() -> None:
    """Answer the requests on stdin, one per line, until it closes; whatever fails is answered, not raised."""
    for line in sys.stdin.buffer:
        try:
            reply = answer(json.loads(line))
        except Exception as exc:  # a malformed request: the proxy gets an answer naming it
            reply = {"failed": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
