"""Generated protobuf and gRPC stubs for linkerd2-proxy-api v0.20 and the transport header.

The ``*_pb2.py`` modules are generated from ``proto/`` by the build (see setup.py);
they are not kept in git.
"""
