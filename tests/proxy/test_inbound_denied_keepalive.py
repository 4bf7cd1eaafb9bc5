"""A denied request leaves the connection open, end to end (proxy.md §7.9, §8.3, §8.4).

Two real proxies (tests/proxy/proxy_harness.py: in-process identity and
destination, real mTLS, real sockets on loopback). The server's proxy applies
the ``cluster-authenticated`` default policy with cluster networks that do not
hold the client, so each request is answered 403 by the server's inbound proxy.
Linkerd answers 403 without closing: the client proxy's pooled HTTP/1
connection to the server carries request after request -- a POST's body read
and dropped on the way -- and the server's proxy counts one accepted
connection for all of them.
"""

from __future__ import annotations

from pathlib import Path

from proxy_harness import Mesh, connection, run, samples, scrape
from test_http1_mesh import Web, header, request


def test_requests_denied_with_403_share_one_connection_between_the_proxies(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies(
                "web", 8080, 80, server_env={"LINKERD2_PROXY_INBOUND_DEFAULT_POLICY": "cluster-authenticated",
                                             "LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS": "10.255.0.0/16"})
            async with Web(server.ip, 8080, "web-0") as web:
                async with connection(svc, 80) as (reader, writer):
                    for method, path, body in (("GET", "/a", None), ("POST", "/b", b"x" * 3000),
                                               ("GET", "/c", None)):
                        head, _ = await request(reader, writer, method, path, body=body)
                        assert head.status == 403, (path, head)
                        assert header(head, b"connection") is None
                assert web.requests == []  # none of them reached the app
            await a.idle()
            await b.idle()
            inbound = await scrape(b)
            # The data path's (the scrape's own connection to the admin port counts too, as Linkerd's does).
            opened = [(labels, value) for labels, value in samples(inbound, "tcp_open_total", direction="inbound",
                                                                  peer="src")
                      if labels["target_port"] != str(b.admin_addr.port)]
            assert sum(value for _, value in opened) == 1, opened  # before: one connection per 403
            denied = samples(inbound, "inbound_http_authz_deny_total")
            assert sum(value for _, value in denied) == 3, denied
            # A denial is counted by its own metric, not as an error (Linkerd's inbound_http_errors_total).
            assert not samples(inbound, "inbound_http_errors_total")

    run(scenario())
