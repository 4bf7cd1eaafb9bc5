"""Tether: a service mesh in Python implementing Linkerd 2.20's architecture.

Layers point downward (see docs/architecture.md and `.importlinter`):
cli -> controllers | proxy | viz -> platform -> store -> resources.
"""

__version__ = "0.1.0"
