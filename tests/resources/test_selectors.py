"""Label selectors, against apimachinery's semantics."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.resources.errors import ValidationError
from tether.resources.selectors import LabelSelector, Operator, Requirement

WEB = {"app": "web-svc", "version": "v11", "tier": "frontend"}


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("", {}, True),
        ("", WEB, True),
        ("app=web-svc", WEB, True),
        ("app==web-svc", WEB, True),
        ("app=voting-svc", WEB, False),
        ("app=web-svc", {}, False),
        ("app!=voting-svc", WEB, True),
        ("app!=web-svc", WEB, False),
        # != and notin match objects that lack the key.
        ("app!=web-svc", {}, True),
        ("app notin (web-svc)", {}, True),
        ("app notin (web-svc,voting-svc)", WEB, False),
        ("app in (web-svc, voting-svc)", WEB, True),
        ("app in (emoji-svc)", WEB, False),
        ("app in (web-svc)", {}, False),
        ("app in (,web-svc)", WEB, True),
        ("app in (,web-svc)", {"app": ""}, True),
        ("app", WEB, True),
        ("app", {"app": ""}, True),
        ("app", {}, False),
        ("!app", {}, True),
        ("!app", WEB, False),
        ("app=web-svc,version=v11", WEB, True),
        ("app=web-svc,version=v12", WEB, False),
        ("app=web-svc,!canary", WEB, True),
        ("canary=", {"canary": ""}, True),
        ("canary=", {}, False),
        ("replicas>2", {"replicas": "3"}, True),
        ("replicas>2", {"replicas": "2"}, False),
        ("replicas<2", {"replicas": "-1"}, True),
        ("replicas>2", {"replicas": "many"}, False),
        ("replicas>2", {}, False),
        ("app.kubernetes.io/name=web", {"app.kubernetes.io/name": "web"}, True),
    ],
)
def test_parsed_selectors_match_as_kubernetes_does(text, labels, matches):
    assert LabelSelector.parse(text).matches(labels) is matches


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("app in ()", "invalid selector 'app in ()': app: values must not be empty for operator in"),
        ("app in", "invalid selector 'app in': expected '(' at the end"),
        ("=web", "invalid selector '=web': found '=' at position 0, expected a label key"),
        ("app web", "invalid selector 'app web': found 'web' at position 4, expected one of =, ==, !=, in, notin, >, <"),
        ("a=b=c", "invalid selector 'a=b=c': found '=' at position 3, expected ',' or the end"),
        ("!app=web", "invalid selector '!app=web': found '=' at position 4, expected ',' or the end"),
        ("app,", "invalid selector 'app,': expected a label key at the end"),
        ("in=x", "invalid selector 'in=x': found 'in' at position 0, expected a label key"),
        ("replicas>two", "invalid selector 'replicas>two': replicas: 'two' is not an integer"),
        ("app in (a b)", "invalid selector 'app in (a b)': found 'b' at position 10, expected ',' or ')'"),
        (
            "App_=x",
            "invalid selector 'App_=x': 'App_' name part must consist of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit",
        ),
        ("<none>", "invalid selector '<none>': found '<' at position 0, expected a label key"),
        ("app=(", "invalid selector 'app=(': found '(' at position 4, expected a value"),
        ("app in web", "invalid selector 'app in web': found 'web' at position 7, expected '('"),
    ],
)
def test_parse_errors_are_validation_errors_at_path_selector(text, message):
    with pytest.raises(ValidationError) as info:
        LabelSelector.parse(text)
    assert (info.value.path, info.value.message) == ("selector", message)


def test_str_is_canonical_kubectl_syntax():
    selector = LabelSelector.parse(" version in (v2, v1), app == web ,!canary, tier ")
    assert str(selector) == "app=web,!canary,tier,version in (v1,v2)"
    assert LabelSelector.parse(str(selector)) == selector
    assert LabelSelector.parse("tier,app==web") == LabelSelector.parse("app=web,tier")


@pytest.mark.parametrize(
    ("spec", "labels", "matches"),
    [
        ({}, WEB, True),
        ({"matchLabels": {"app": "web-svc"}}, WEB, True),
        ({"matchLabels": {"app": "web-svc", "version": "v12"}}, WEB, False),
        ({"matchExpressions": [{"key": "version", "operator": "In", "values": ["v11", "v12"]}]}, WEB, True),
        ({"matchExpressions": [{"key": "version", "operator": "NotIn", "values": ["v11"]}]}, WEB, False),
        ({"matchExpressions": [{"key": "canary", "operator": "NotIn", "values": ["true"]}]}, WEB, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, WEB, True),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, WEB, False),
        (
            {"matchLabels": {"app": "web-svc"}, "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            WEB,
            False,
        ),
    ],
)
def test_spec_selectors_and_their_terms(spec, labels, matches):
    assert LabelSelector.from_spec(spec, "spec.selector").matches(labels) is matches


def test_a_missing_spec_selector_matches_nothing_and_an_empty_one_everything():
    assert not LabelSelector.from_spec(None, "spec.selector").matches({})
    assert LabelSelector.from_spec({}, "spec.selector").matches({})
    assert LabelSelector.from_spec({}, "spec.selector").is_empty
    assert not LabelSelector.from_spec(None, "spec.selector").is_empty
    assert not LabelSelector.parse("app").is_empty


@pytest.mark.parametrize("selector", [None, {}])
def test_a_service_without_selector_selects_no_pods(selector):
    service_selector = LabelSelector.for_service(selector, "spec.selector")
    assert not service_selector.matches({})
    assert not service_selector.matches(WEB)
    assert str(service_selector) == "<none>"


def test_a_service_selector_is_equality_on_every_entry():
    selector = LabelSelector.for_service({"app": "web-svc", "version": "v11"}, "spec.selector")
    assert selector.matches(WEB)
    assert not selector.matches({"app": "web-svc"})
    assert selector == LabelSelector.parse("app=web-svc,version=v11")


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        (
            {"matchExpressions": [{"key": "version", "operator": "In", "values": []}]},
            "spec.selector.matchExpressions[0].values",
            "must not be empty when operator is In",
        ),
        (
            {"matchExpressions": [{"key": "version", "operator": "NotIn"}]},
            "spec.selector.matchExpressions[0].values",
            "must not be empty when operator is NotIn",
        ),
        (
            {"matchExpressions": [{"key": "version", "operator": "Exists", "values": ["v1"]}]},
            "spec.selector.matchExpressions[0].values",
            "must be empty when operator is Exists",
        ),
        (
            {"matchExpressions": [{"key": "version", "operator": "Equals", "values": ["v1"]}]},
            "spec.selector.matchExpressions[0].operator",
            "unsupported value 'Equals' (supported: In, NotIn, Exists, DoesNotExist)",
        ),
        ({"matchExpressions": [{"operator": "Exists"}]}, "spec.selector.matchExpressions[0].key", "required"),
        ({"matchLabels": {"version": 11}}, "spec.selector.matchLabels[version]", "expected a string"),
        (
            {"matchLabels": {"app": "web svc"}},
            "spec.selector.matchLabels[app]",
            "'web svc' a label value must be empty or consist of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit",
        ),
        (
            {"matchLabels": {"-app": "web"}},
            "spec.selector.matchLabels[-app]",
            "'-app' name part must consist of letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        ),
        ({"matchLabels": ["app"]}, "spec.selector.matchLabels", "expected a mapping"),
        ("app=web", "spec.selector", "expected a mapping"),
    ],
)
def test_spec_selector_errors_carry_field_paths(spec, path, message):
    with pytest.raises(ValidationError) as info:
        LabelSelector.from_spec(spec, "spec.selector")
    assert (info.value.path, info.value.message) == (path, message)


def test_service_selector_values_must_be_strings():
    with pytest.raises(ValidationError) as info:
        LabelSelector.for_service({"version": 2}, "spec.selector")
    assert (info.value.path, info.value.message) == ("spec.selector[version]", "expected a string")


_NAME = st.from_regex(r"[a-z0-9]([-a-z0-9_.]{0,8}[a-z0-9])?", fullmatch=True)
_KEY = st.one_of(_NAME, st.builds(lambda p, n: f"{p}/{n}", st.from_regex(r"[a-z]{1,5}(\.[a-z]{1,4}){0,2}", fullmatch=True), _NAME))
_VALUES = st.lists(_NAME, min_size=1, max_size=3)


@st.composite
def _requirements(draw):
    key = draw(_KEY)
    operator = draw(st.sampled_from(list(Operator)))
    if operator in (Operator.IN, Operator.NOT_IN):
        values = tuple(sorted(set(draw(_VALUES))))
    elif operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        values = ()
    elif operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        values = (str(draw(st.integers(-100, 100))),)
    else:
        values = (draw(st.one_of(st.just(""), _NAME)),)
    return Requirement(key, operator, values)


_SELECTORS = st.lists(_requirements(), max_size=4).map(lambda rs: LabelSelector(tuple(rs)))
_LABELS = st.dictionaries(_KEY, st.one_of(_NAME, st.integers(-5, 5).map(str)), max_size=4)


@settings(deadline=None)
@given(_SELECTORS)
def test_parse_of_str_round_trips(selector):
    assert LabelSelector.parse(str(selector)) == selector


@settings(deadline=None)
@given(_KEY, _VALUES, _LABELS)
def test_notin_is_the_negation_of_in_even_without_the_key(key, values, labels):
    listed = ",".join(values)
    assert LabelSelector.parse(f"{key} notin ({listed})").matches(labels) is not (
        LabelSelector.parse(f"{key} in ({listed})").matches(labels)
    )


@settings(deadline=None)
@given(_KEY, _NAME, _LABELS)
def test_not_equals_is_the_negation_of_equals_and_bang_of_exists(key, value, labels):
    assert LabelSelector.parse(f"{key}!={value}").matches(labels) is not LabelSelector.parse(f"{key}={value}").matches(labels)
    assert LabelSelector.parse(f"!{key}").matches(labels) is not LabelSelector.parse(key).matches(labels)


@settings(deadline=None)
@given(st.dictionaries(_KEY, _NAME, max_size=4), _LABELS)
def test_match_labels_means_every_entry_is_equal(match_labels, labels):
    selector = LabelSelector.from_spec({"matchLabels": match_labels}, "spec.selector")
    assert selector.matches(labels) is all(labels.get(k) == v for k, v in match_labels.items())
