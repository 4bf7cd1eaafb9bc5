"""Tests of the Kubernetes platform and ``tether install``.

No Kubernetes API server can run on the machines these tests run on.  The API is
played by ``kmock`` (a Kubernetes API emulator from PyPI, serving real HTTP on
localhost): its stateful emulator for lists, watches and object changes, plus
scripted reactions where a behaviour must be forced (bookmarks, 410 Gone, errors,
TokenReview answers).  Manifests are checked against the Kubernetes 1.35 OpenAPI
schemas shipped by ``kubernetes-validate``, offline.
"""
