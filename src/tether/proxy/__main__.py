"""``python -m tether.proxy``: the proxy, configured by the ``LINKERD2_PROXY_*`` environment."""

import os
import sys

from tether.proxy.main import main

sys.exit(main(os.environ))
