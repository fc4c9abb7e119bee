"""The annotation vocabulary: parsing, hashing, round trips and error messages."""

import pytest

from remat_common import Annotation, AnnotationError, parse_annotation

pytestmark = pytest.mark.lock_only  # annotations parsed: no JAX

ALL_STRINGS = ["inherit", "save", "recompute", "offload", "dots", "dots_no_batch", "custom"]


@pytest.mark.compat
@pytest.mark.parametrize("value", ALL_STRINGS)
def test_strings_parse_to_their_kind(value):
    ann = parse_annotation(value)
    assert ann.kind == value
    assert ann.is_boundary == (value in {"recompute", "offload", "dots", "dots_no_batch"})
    assert parse_annotation(ann.to_config()) == ann
    assert hash(ann) == hash(parse_annotation(value))


@pytest.mark.compat
def test_names_mapping():
    ann = parse_annotation({"save": ["attn_out", "h"], "offload": "mlp_in"})
    assert ann == Annotation("names", save=frozenset({"attn_out", "h"}), offload=frozenset({"mlp_in"}))
    assert ann.is_boundary and ann.moves_to_host
    assert parse_annotation(ann.to_config()) == ann
    assert {ann: 1}[parse_annotation({"offload": ["mlp_in"], "save": ["h", "attn_out"]})] == 1


@pytest.mark.compat
def test_memory_kinds_round_trip():
    ann = parse_annotation({"remat": "offload", "offload_dst": "unpinned_host"})
    assert (ann.kind, ann.offload_dst, ann.offload_src) == ("offload", "unpinned_host", None)
    assert parse_annotation(ann.to_config()) == ann
    named = parse_annotation({"offload": ["x"], "offload_src": "device", "offload_dst": "pinned_host"})
    assert parse_annotation(named.to_config()) == named


@pytest.mark.compat
@pytest.mark.parametrize(
    "value, match",
    [
        ("remat", r"unknown remat annotation 'remat'.*Allowed strings: 'custom', 'dots', "
                  r"'dots_no_batch', 'inherit', 'offload', 'offload_dots_no_batch', 'recompute', 'save'.*Fix"),
        (3, r"unknown remat annotation 3"),
        ({"save": ["a"], "keep": ["b"]}, r"unknown key\(s\) 'keep'.*Allowed keys: 'nested', 'offload', "
                                         r"'offload_dst', 'offload_src', 'remat', 'save'"),
        ({"save": ["a", "b"], "offload": ["b"]}, r"names 'b' are listed both under \"save\" and "
                                                 r"under \"offload\".*Fix: remove each name"),
        ({"save": [""]}, r"activation name '' .*non-empty string"),
        ({"save": {"a": 1}}, r"'save' .* must be a list of activation names.*Fix"),
        ({"remat": "recompute", "offload_dst": "pinned_host"}, r"offload_src/offload_dst given with "
                                                               r"remat='recompute'.*Fix"),
        ({"remat": "offload", "save": ["a"]}, r"mixes 'remat' with name lists.*Fix"),
        ({"offload_dst": "pinned_host"}, r"names no activations.*Fix"),
        ({"save": ["a"], "offload_dst": "pinned_host"}, r"nothing is offloaded.*Fix"),
        ({"remat": "everything"}, r"unknown remat annotation 'everything'"),
    ],
)
def test_errors_name_value_allowed_and_fix(value, match):
    with pytest.raises(AnnotationError, match="(?s)" + match):
        parse_annotation(value)


@pytest.mark.compat
def test_error_names_module_path_and_source():
    with pytest.raises(AnnotationError, match=r"module 'layers.3.attn' \(plan.yaml:4\): unknown"):
        parse_annotation("recomptue", path="layers.3.attn", source="plan.yaml:4")
