"""Resolution: later rules win, one policy per boundary, nested intent merged or refused, stacks."""

import pytest

from remat_common import Plan, PlanError, UnmatchedPatternWarning, parse_annotation, resolve
from remat_common.adapter import layer_groups

pytestmark = pytest.mark.lock_only  # rules resolved along module paths: no JAX

PATHS = ["embed", "layers"] + [f"layers.{i}{s}" for i in range(4) for s in ("", ".attn", ".mlp")] + ["head"]


def _plan(rules, **defaults):
    return Plan.from_mapping(rules, **defaults)


@pytest.mark.compat
def test_later_rules_win_and_boundaries_per_layer():
    r = resolve(_plan({"layers.*": "recompute", "layers.[0-1]": "offload"}), PATHS)
    assert r.annotation("layers.0") == parse_annotation("offload")
    assert r.annotation("layers.2") == parse_annotation("recompute")
    assert r.annotation("embed").kind == "inherit"
    assert [b.path for b in r.boundaries] == [f"layers.{i}" for i in range(4)]
    assert r.boundary("layers.0").offload == {"layers.0/__input__"}
    assert r.boundary("layers.2").offload == frozenset() and r.boundary("layers.2").save == frozenset()
    assert dict(r.tagged_inputs) == {"layers.0": "layers.0/__input__", "layers.1": "layers.1/__input__"}
    assert r.matches == (tuple(f"layers.{i}" for i in range(4)), ("layers.0", "layers.1"))


@pytest.mark.compat
def test_names_inside_a_boundary_merge_into_one_policy():
    r = resolve(_plan({"layers.*": "recompute", "layers.*.attn": {"save": ["attn_out"]},
                       "layers.3.mlp": {"offload": ["h"]}}), PATHS)
    assert len(r.boundaries) == 4  # no nested boundaries
    b0 = r.boundary("layers.0")
    assert b0.save == {"layers.0.attn/attn_out", "attn_out"} and b0.offload == frozenset()
    b3 = r.boundary("layers.3")
    assert b3.save == {"layers.3.attn/attn_out", "attn_out"}
    assert b3.offload == {"layers.3.mlp/h", "h"}
    assert b3.requested == {"attn_out", "h"}


@pytest.mark.compat
def test_names_at_the_boundary_reach_the_whole_subtree_and_relative_names_one_module():
    r = resolve(_plan({"layers.0": {"save": ["out", "mlp/h"]}}), PATHS)
    b = r.boundary("layers.0")
    assert b.save == {"layers.0/out", "layers.0.attn/out", "layers.0.mlp/out", "out",
                      "layers.0.mlp/h"}


@pytest.mark.compat
def test_deeper_recompute_overrides_outer_names_and_offload_merges_input():
    r = resolve(_plan({"layers.0": {"save": ["out"]}, "layers.0.mlp": "recompute",
                       "layers.0.attn": "offload"}), PATHS)
    b = r.boundary("layers.0")
    assert "layers.0.mlp/out" not in b.save and "layers.0.attn/out" not in b.save
    assert {"layers.0/out", "out"} <= b.save
    assert b.offload == {"layers.0.attn/__input__"}
    assert r.input_tag("layers.0.attn") == "layers.0.attn/__input__"
    assert r.active_paths == ("layers.0", "layers.0.attn")


@pytest.mark.compat
@pytest.mark.parametrize(
    "rules, match",
    [
        ({"layers.*": "recompute", "layers.0.attn": "save"},
         r"module 'layers.0.attn': annotation 'save' is inside the remat boundary at 'layers.0' "
         r"\(recompute\).*Fix: list what to keep"),
        ({"layers.*": "dots", "layers.0.attn": {"save": ["o"]}},
         r"inside the remat boundary at 'layers.0' \(dots\).*save_from_both_policies.*Fix"),
        ({"layers.*": "recompute", "layers.0.attn": "dots_no_batch"},
         r"annotation 'dots_no_batch' is inside.*Fix"),
    ],
)
def test_unmergeable_nesting_is_refused(rules, match):
    with pytest.raises(PlanError, match="(?s)" + match):
        resolve(_plan(rules), PATHS)


@pytest.mark.compat
def test_explicit_nesting_gives_nested_boundaries():
    r = resolve(_plan({"layers.*": "recompute", "layers.0.attn": "dots"}, nesting=True), PATHS)
    assert [b.path for b in r.boundaries] == ["layers.0", "layers.1", "layers.2", "layers.3", "layers.0.attn"]
    assert r.enclosing_boundary("layers.0.attn").path == "layers.0.attn"
    assert r.enclosing_boundary("layers.0.mlp").path == "layers.0"
    assert r.enclosing_boundary("embed") is None


@pytest.mark.compat
def test_unmatched_pattern_strict_lists_nearest_paths():
    with pytest.raises(PlanError, match=r"(?s)pattern 'layer.*.atn' \(annotation recompute\) matches "
                                        r"no module.*Nearest existing paths: .*'layers.0.attn'.*lenient"):
        resolve(_plan({"layer.*.atn": "recompute"}), PATHS)


@pytest.mark.compat
def test_unmatched_pattern_lenient_warns():
    with pytest.warns(UnmatchedPatternWarning, match="matches no module"):
        r = resolve(_plan({"nope": "recompute", "head": "recompute"}, mode="lenient"), PATHS)
    assert [b.path for b in r.boundaries] == ["head"]


@pytest.mark.compat
def test_stack_annotation_applies_per_layer_and_groups_split():
    paths = ["embed", "layers"] + [f"layers.{i}{s}" for i in range(6) for s in ("", ".attn")]
    r = resolve(_plan({"layers": "recompute", "layers.[0-1]": "offload",
                       "layers.*.attn": {"save": ["o"]}}), paths, stacks=["layers"])
    assert "layers" not in {b.path for b in r.boundaries}
    assert [b.path for b in r.boundaries] == [f"layers.{i}" for i in range(6)]
    groups = layer_groups(r, "layers", 6)
    assert [(g.start, g.stop, g.path) for g in groups] == [(0, 2, "layers.0"), (2, 6, "layers.2")]
    assert r.boundary("layers.2").save == {"layers.2.attn/o", "o"}
    # A stack annotated as a whole is one group.
    r1 = resolve(_plan({"layers": "offload"}), paths, stacks=["layers"])
    assert [(g.start, g.stop) for g in layer_groups(r1, "layers", 6)] == [(0, 6)]


@pytest.mark.compat
def test_describe():
    r = resolve(_plan({"layers.0": {"save": ["o"], "offload": ["h"]}}), PATHS)
    assert r.describe().startswith("layers.0: names  save ")
    assert resolve(Plan(), PATHS).describe() == "(no remat boundaries: everything is saved)"
