"""The data plane: a transparent mTLS proxy beside every workload. Imports no controller."""

from tether.proxy import native

native.install()  # before any compiled module is imported: see native.py
