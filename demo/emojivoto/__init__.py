"""Emojivoto, written for Tether: the application the demo meshes.

Four programs, each a module run as ``python -m emojivoto.<app>`` from the
``demo/`` directory (the manifests in ``demo/manifests`` do exactly that):

- ``emoji``    gRPC ``emojivoto.v1.EmojiService``: ListAll, FindByShortcode;
- ``voting``   gRPC ``emojivoto.v1.VotingService``: Vote, Results (a vote for
               :doughnut: fails on purpose, as in Buoyant's emojivoto);
- ``web``      HTTP/1.1 front end: ``/``, ``/api/list``, ``/api/vote?choice=``,
               ``/api/leaderboard``; calls emoji and voting over gRPC;
- ``vote_bot`` a traffic generator calling web at a steady rate.

The gRPC services are real gRPC (grpcio, HTTP/2, ``application/grpc``); their
messages are JSON documents instead of protobuf so that no protoc step is
needed (``emojivoto.rpc``).  Peers are addressed by service name
(``emoji-svc.emojivoto:8080``), which the platform resolves in each pod.
"""
