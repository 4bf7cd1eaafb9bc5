"""The wire contracts: linkerd2-proxy-api v0.20 stubs, the transport header, address packing.

Imported by the controllers, the proxy and the CLI, e.g.
``from tether.api import destination_pb2, destination_pb2_grpc``. The
``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` modules are generated from
``proto/`` by ``proto/generate.py``, which the build runs (see setup.py); they are
not kept in git. ``addresses`` is hand-written: IP and TCP address packing.
"""
