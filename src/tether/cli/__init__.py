"""The ``tether`` command: a thin shell over the public APIs of the other packages.

Only this package reads argv and the environment (``TETHER_HOME`` and friends).
"""
