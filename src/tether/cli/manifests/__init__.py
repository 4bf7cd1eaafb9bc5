"""Package data and builders for ``tether install``: default values, the HA overlay, and the CRDs.

``tether.cli.install_cmd`` reads ``values.yaml``/``values-ha.yaml`` with ``load_values``
and asks ``crds.render`` for the CustomResourceDefinitions of every mesh kind.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def load_values(name: str) -> dict[str, Any]:
    """A values document shipped with the package (``values.yaml`` or ``values-ha.yaml``)."""
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    assert isinstance(data, dict), name
    return data
