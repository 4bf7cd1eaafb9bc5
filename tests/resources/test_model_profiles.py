"""ServiceProfile: routes, condition trees, response classes, retries, timeouts, traffic split."""

from fractions import Fraction

import pytest

from tether.resources.errors import ValidationError
from tether.resources.model import parse
from tether.resources.profiles import RequestMatch, ResponseMatch, RetryBudget, StatusRange

KEY = ("ServiceProfile.linkerd.io", "web-svc.emojivoto.svc.cluster.local")
PREFIX = "ServiceProfile web-svc.emojivoto.svc.cluster.local: "


def test_emojivoto_profile(manifest):
    profile = parse(manifest(*KEY))
    assert profile.namespace == "emojivoto"
    list_route, vote_route = profile.spec.routes
    assert list_route.name == "GET /api/list"
    assert list_route.condition == RequestMatch(method="GET", path_regex="/api/list")
    assert (list_route.is_retryable, list_route.timeout, list_route.response_classes) == (True, 0.3, ())
    assert vote_route.condition == RequestMatch(
        all=(
            RequestMatch(method="POST"),
            RequestMatch(path_regex="/api/vote"),
            RequestMatch(not_=RequestMatch(path_regex="/api/vote/internal")),
        )
    )
    failure, success = vote_route.response_classes
    assert (failure.condition, failure.is_failure) == (ResponseMatch(status=StatusRange(500, 599)), True)
    assert success.condition == ResponseMatch(
        any=(ResponseMatch(status=StatusRange(429, 429)), ResponseMatch(status=StatusRange(404, None)))
    )
    assert not success.is_failure
    assert (vote_route.is_retryable, vote_route.timeout) == (False, 90.0)
    assert profile.spec.retry_budget == RetryBudget(retry_ratio=0.2, min_retries_per_second=10, ttl=10.0)
    canary = profile.spec.dst_overrides[1]
    assert canary.authority == "web-svc-canary.emojivoto.svc.cluster.local:80"
    assert (canary.weight.text, canary.weight.value, canary.weight.milli_value()) == ("100m", Fraction(1, 10), 100)


def test_optional_parts_default(manifest, edits):
    obj = edits.set(manifest(*KEY), "spec", {"routes": [{"name": "all", "condition": {"pathRegex": ".*"}}]})
    spec = parse(obj).spec
    assert (spec.retry_budget, spec.dst_overrides) == (None, ())
    assert (spec.routes[0].timeout, spec.routes[0].is_retryable) == (None, False)
    assert parse(edits.set(obj, "spec", {})).spec.routes == ()


def test_empty_all_is_set_and_distinct_from_absent(manifest, edits):
    obj = edits.set(manifest(*KEY), "spec.routes[0].condition", {"all": []})
    assert parse(obj).spec.routes[0].condition == RequestMatch(all=())


def test_integer_weights_and_the_v1alpha1_version(manifest, edits):
    obj = edits.set(manifest(*KEY), "spec.dstOverrides[0].weight", 1)
    assert parse(obj).spec.dst_overrides[0].weight.milli_value() == 1000
    old = edits.set(obj, "apiVersion", "linkerd.io/v1alpha1")
    assert parse(old).type.api_version == "linkerd.io/v1alpha2"
    assert str(pytest.raises(ValidationError, parse, edits.delete(old, "spec.routes")).value) == PREFIX + "spec.routes: required"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.routes[0].condition.method", ["GET"], "spec.routes[0].condition.method: expected a string"),
        ("spec.routes[0].condition", None, "spec.routes[0].condition: required"),
        ("spec.routes[0].name", None, "spec.routes[0].name: required"),
        ("spec.routes[0].name", "", "spec.routes[0].name: must not be empty"),
        ("spec.routes[0].condition", {}, "spec.routes[0].condition: must set at least one of all, any, not, method, pathRegex"),
        ("spec.routes[0].condition", {"method": ""}, "spec.routes[0].condition: must set at least one of all, any, not, method, pathRegex"),
        ("spec.routes[1].condition.all[2].not", {}, "spec.routes[1].condition.all[2].not: must set at least one of all, any, not, method, pathRegex"),
        ("spec.routes[1].condition.all[1]", "POST", "spec.routes[1].condition.all[1]: expected a mapping"),
        ("spec.routes[1].condition.all", {"method": "POST"}, "spec.routes[1].condition.all: expected a list"),
        ("spec.routes[0].isRetryable", "true", "spec.routes[0].isRetryable: expected a boolean"),
        ("spec.routes[0].timeout", "300", "spec.routes[0].timeout: missing unit in duration '300'"),
        ("spec.routes[0].timeout", "1d", "spec.routes[0].timeout: unknown unit 'd' in duration '1d'"),
        ("spec.routes[0].timeout", "-1s", "spec.routes[0].timeout: must not be negative"),
        ("spec.routes[0].timeout", 30, "spec.routes[0].timeout: expected a string"),
        ("spec.routes[1].responseClasses[0].condition", None, "spec.routes[1].responseClasses[0].condition: required"),
        ("spec.routes[1].responseClasses[0].condition", {}, "spec.routes[1].responseClasses[0].condition: must set at least one of all, any, not, status"),
        ("spec.routes[1].responseClasses[0].condition.status.min", 99, "spec.routes[1].responseClasses[0].condition.status.min: must be between 100 and 599"),
        ("spec.routes[1].responseClasses[0].condition.status.max", 600, "spec.routes[1].responseClasses[0].condition.status.max: must be between 100 and 599"),
        ("spec.routes[1].responseClasses[0].condition.status.max", 499, "spec.routes[1].responseClasses[0].condition.status.max: must not be less than min"),
        ("spec.routes[1].responseClasses[0].condition.status.min", "500", "spec.routes[1].responseClasses[0].condition.status.min: expected an integer"),
        ("spec.routes[1].responseClasses[0].isFailure", 1, "spec.routes[1].responseClasses[0].isFailure: expected a boolean"),
        ("spec.retryBudget.ttl", None, "spec.retryBudget.ttl: required"),
        ("spec.retryBudget.ttl", "ten seconds", "spec.retryBudget.ttl: invalid duration 'ten seconds'"),
        ("spec.retryBudget.retryRatio", -0.1, "spec.retryBudget.retryRatio: must be at least 0"),
        ("spec.retryBudget.retryRatio", "0.2", "spec.retryBudget.retryRatio: expected a number"),
        ("spec.retryBudget.minRetriesPerSecond", 1.5, "spec.retryBudget.minRetriesPerSecond: expected an integer"),
        ("spec.dstOverrides[0].weight", None, "spec.dstOverrides[0].weight: required"),
        ("spec.dstOverrides[0].weight", "ninety", "spec.dstOverrides[0].weight: invalid quantity 'ninety': expected a number with an optional suffix such as m, k, Ki"),
        ("spec.dstOverrides[0].weight", "-1", "spec.dstOverrides[0].weight: must not be negative"),
        ("spec.dstOverrides[1].authority", None, "spec.dstOverrides[1].authority: required"),
        ("spec.routes", {"name": "x"}, "spec.routes: expected a list"),
    ],
)
def test_profile_errors(manifest, edits, path, value, expected):
    obj = manifest(*KEY)
    obj = edits.change(obj, path, value)
    with pytest.raises(ValidationError) as info:
        parse(obj)
    assert str(info.value) == PREFIX + expected


def test_profile_names_are_fqdns_without_a_trailing_dot(manifest, edits):
    obj = edits.set(manifest(*KEY), "metadata.name", "web-svc.emojivoto.svc.cluster.local.")
    with pytest.raises(ValidationError) as info:
        parse(obj)
    assert str(info.value) == (
        "ServiceProfile web-svc.emojivoto.svc.cluster.local.: metadata.name: 'web-svc.emojivoto.svc.cluster.local.' "
        "must be a DNS-1123 subdomain: lower case letters, digits, '-' and '.', starting and ending with a letter or digit"
    )
