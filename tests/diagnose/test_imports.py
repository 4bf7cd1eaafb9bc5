"""What ``tether diagnose`` loads: the controllers' clients, not their services, and not the typed resource model.

Importing was most of a diagnosis's CPU time (``bench/diagnose.py`` measures it);
these assert the module sets in a fresh interpreter, so a new eager import in a
package ``__init__`` (or in the store's read path) shows up here, not as a slower CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["tether.destination.service", "tether.destination.watcher", "tether.policy.service",
         "tether.policy.inbound", "tether.policy.outbound", "tether.resources.model", "tether.injector.config",
         "tether.injector.patch", "prometheus_client"]


def _loaded(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_the_diagnose_command_and_the_clients_load_no_service() -> None:
    loaded = _loaded("import tether.cli.diagnose, tether.destination.client, tether.policy.client\n"
                     "from tether.store import Store")
    assert "tether.destination.client" in loaded and "tether.policy.client" in loaded
    assert sorted(loaded & set(HEAVY)) == []


def test_the_public_names_still_resolve_on_first_use() -> None:
    loaded = _loaded("from tether.destination import DestinationService, TlsFiles\n"
                     "from tether.policy import PolicyService\nfrom tether.injector import MeshConfig, inject")
    assert {"tether.destination.service", "tether.policy.service", "tether.injector.config"} <= loaded


def test_an_unknown_name_is_an_attribute_error() -> None:
    code = "import tether.policy\ntry:\n    tether.policy.Nope\nexcept AttributeError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "module 'tether.policy' has no attribute 'Nope'" in out
