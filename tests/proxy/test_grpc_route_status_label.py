"""The ``grpc_status`` label of ``outbound_grpc_route_*`` and ``..._backend_*``: always a code's name.

linkerd2-proxy labels a gRPC route's response by its status's name and, where there is none (the proxy
answered an error, the backend's response ended without trailers) or the code is not one it knows, by
``UNKNOWN``: the label is never empty, unlike the HTTP family's ``http_status``.
"""

from __future__ import annotations

from tether.proxy.core.policy_metrics import BackendSeries, RouteSeries


def test_a_grpc_response_without_a_status_is_labelled_unknown() -> None:
    series = RouteSeries(grpc=True, now=0.0)
    series.ended(200, 0, 0.01)
    series.ended(200, 14, 0.01)
    series.ended(0, None, 0.01, "REQUEST_TIMEOUT")  # the proxy answered: no status came
    series.ended(200, None, 0.01)  # the backend ended its response without trailers
    series.ended(200, 99, 0.01)  # not a code of the spec
    assert series.statuses == {
        'grpc_status="OK",error=""': 1,
        'grpc_status="UNAVAILABLE",error=""': 1,
        'grpc_status="UNKNOWN",error="REQUEST_TIMEOUT"': 1,
        'grpc_status="UNKNOWN",error=""': 2,
    }


def test_an_http_response_without_a_status_keeps_an_empty_http_status() -> None:
    series = BackendSeries(grpc=False, now=0.0)
    series.ended(0, None, 0.01, "FAIL_FAST")
    series.ended(503, None, 0.01)
    assert series.statuses == {'http_status="",error="FAIL_FAST"': 1, 'http_status="503",error=""': 1}
