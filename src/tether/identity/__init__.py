"""The identity component: trust anchor, issuer, leaf issuance and the Certify service."""
