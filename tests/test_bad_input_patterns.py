"""Bad path patterns, and what ``resolve`` is given, never crash, hang or pass silently (issues 13
and 27): malformed patterns and ranges, ranges past the model, relative names that match nothing,
malformed module paths. Scale cases count the matcher's steps instead of timing it. No JAX
compilation happens here.
"""

from __future__ import annotations

import re
import warnings

import pytest

import remat_common as rc
from remat_common import Plan, PlanError, resolve
from remat_common.adapter import path_matches
from remat_common.internal import PathIndex, compiled, parse_pattern

from bad_input import MAX_MESSAGE
from fixtures.work import growth, lines_run

pytestmark = pytest.mark.lock_only  # what is refused and the message: checked before JAX runs


# -- patterns --------------------------------------------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("pattern, match", [
    ("layers.[0-3]*", r"segment '\[0-3\]\*', which is not a numeric range.*'\[0-3\]' as the whole"),
    ("layers.[0 - 3]", r"segment '\[0 - 3\]'"),
    ("layers.[0-]", r"segment '\[0-\]'.*write both ends"),
    ("layers.[-1-2]", r"segment '\[-1-2\]'"),
    ("layers.[3-1]", r"segment '\[3-1\]'.*write '\[1-3\]'"),
    ("layers.[3-1:2]", r"segment '\[3-1:2\]'.*write '\[1-3:2\]'"),
    ("layers.[0-7:0]", r"a stride is a positive integer: write '\[0-7:1\]'"),
    ("layers.[0-7:]", r"segment '\[0-7:\]'"),
    ("mlp.down[2-1]", r"segment 'down\[2-1\]'.*write 'down\[1-2\]'"),
    ("mlp.down[1-2]x", r"segment 'down\[1-2\]x'.*write 'down\[1-2\]' \(the names down1 ... down2\)"),
    ("layers.1[0-3]", r"segment '1\[0-3\]'"),
    ("layers.[0-3", r"segment '\[0-3'.*Fix: write '\[0-3\]' as the whole segment"),  # unclosed
    ("layers.[0-3:" + "9" * 19 + "]", r"Fix: write ends of at most 18 digits"),
    ("layers.[\u0660-\u0663]", r"not a numeric range.*write both ends"),  # Arabic-Indic digits
    ("layers.[1_0-20]", r"segment '\[1_0-20\]'.*Fix: write both ends"),  # not '[1-0]'
    ("layers.[0-" + "9" * 19 + "]", r"Fix: write ends of at most 18 digits"),
    ("layers.[0-" + "9" * 5000 + "]", r"Fix: write ends of at most 18 digits"),  # int() refuses
    ("layers..0", r"empty segment"),
    (".layers", r"empty segment"),
    ("layers.", r"empty segment"),
    ("layers. 0", r"whitespace"),
    ("layers.0\n", r"whitespace"),
    ("", r"empty or non-string"),
    ("   ", r"empty or non-string"),
    ("x" * 20_000, r"is 20000 characters long"),
])
def test_malformed_patterns_are_refused(pattern, match):
    with pytest.raises(PlanError, match="(?s)" + match) as info:
        parse_pattern(pattern, "plan.yaml:4")
    assert str(info.value).startswith("plan.yaml:4: ")
    assert len(str(info.value)) < MAX_MESSAGE
    with pytest.raises(PlanError):
        Plan.from_mapping({pattern: "recompute"})


@pytest.mark.compat
def test_a_range_after_a_name_covers_its_numeric_suffix_and_the_fix_for_a_bad_one_works():
    """``down[1-2]`` is a numeric range over a name's numeric suffix (down1, down2; never down12
    or down10); ``down[12]`` stays an fnmatch class. The fix a malformed one gets resolves."""
    paths = ["mlp", *(f"mlp.down{i}" for i in (1, 2, 3, 4, 10, 12)), "mlp.up1"]

    def hits(pattern: str) -> list[str]:
        return [b.path for b in resolve(Plan.from_mapping({pattern: "recompute"}), paths).boundaries]

    assert hits("mlp.down[1-2]") == ["mlp.down1", "mlp.down2"]
    assert hits("mlp.down[1-12:3]") == ["mlp.down1", "mlp.down4", "mlp.down10"]
    assert hits("mlp.down[12]") == ["mlp.down1", "mlp.down2"]  # a character class, as in fnmatch
    with pytest.raises(PlanError, match=r"write 'down\[1-2\]'") as info:
        Plan.from_mapping({"mlp.down[1-2]*": "recompute"})
    fix = re.search(r"write '([^']*)'", str(info.value)).group(1)
    assert hits(f"mlp.{fix}") == ["mlp.down1", "mlp.down2"]


@pytest.mark.compat
def test_a_stride_takes_every_nth_layer():
    """``layers.[0-31:2]``: every second layer (torchtitan's selective_ac_option '2')."""
    paths = ["layers", *(f"layers.{i}" for i in range(32)), *(f"layers.{i}.mlp" for i in range(32))]
    got = resolve(Plan.from_mapping({"layers.[0-31:2]": "recompute"}), paths)
    assert [b.path for b in got.boundaries] == [f"layers.{i}" for i in range(0, 32, 2)]
    odd = resolve(Plan.from_mapping({"layers.[1-31:2].mlp": "recompute"}), paths)
    assert [b.path for b in odd.boundaries] == [f"layers.{i}.mlp" for i in range(1, 32, 2)]
    assert path_matches("**.[0-9:3]", "a.layers.6") and not path_matches("**.[0-9:3]", "a.layers.7")
    with pytest.raises(PlanError, match=r"the range \[0-40:4\] reaches 32, 36, 40, but no such"):
        resolve(Plan.from_mapping({"layers.[0-40:4]": "recompute"}), paths)


@pytest.mark.compat
@pytest.mark.parametrize("value", [3, None, 1.5, ["a"], {"a": 1}, b"layers"])
def test_non_string_patterns_are_refused(value):
    with pytest.raises(PlanError, match=r"empty or non-string path pattern"):
        Plan.from_rules([(value, "recompute")])


def _reference_match(pats: list[str], segs: list[str]) -> bool:
    """Obvious recursive matcher, for small cases only."""
    if not pats:
        return not segs
    if pats[0] == "**":
        return any(_reference_match(pats[1:], segs[i:]) for i in range(len(segs) + 1))
    if not segs:
        return False
    m = re.fullmatch(r"\[(\d+)-(\d+)\]", pats[0])
    if m:
        ok = segs[0].isdigit() and int(m.group(1)) <= int(segs[0]) <= int(m.group(2))
    else:
        import fnmatch
        ok = fnmatch.fnmatchcase(segs[0], pats[0])
    return ok and _reference_match(pats[1:], segs[1:])


@pytest.mark.compat
def test_matcher_and_index_agree_with_the_obvious_matcher():
    import random

    rnd = random.Random(13)
    names = ["layers", "0", "1", "2", "10", "attn", "mlp", "fc1", "x"]
    paths = sorted({".".join(rnd.choice(names) for _ in range(rnd.randint(1, 5)))
                    for _ in range(300)})
    pieces = [*names, "*", "**", "[0-1]", "[1-10]", "fc?", "m*", "[am]*"]
    patterns = {".".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 5))) for _ in range(300)}
    index = PathIndex(["", *paths])
    for pattern in sorted(patterns):
        want = tuple(p for p in paths if _reference_match(pattern.split("."), p.split(".")))
        assert tuple(p for p in paths if path_matches(pattern, p)) == want, pattern
        assert index.matching(pattern) == want, pattern


@pytest.mark.compat
def test_pathological_double_star_is_linear():
    pat = compiled("**.**.**.**.**.x")
    assert len(pat.segments) == 2  # '**.**' folds into '**'
    for depth in (10, 20, 40, 80):
        ok, steps = pat.match_steps(["m"] * depth)
        assert not ok and steps <= 2 * depth
    eight = compiled(".".join(["**", "a"] * 8))
    ok, steps = eight.match_steps(["a"] * 30)
    assert ok and steps <= 30 * len(eight.segments)
    deep = ".".join(["a"] * 1200)  # no recursion limit
    assert compiled(deep).matches(deep)
    assert compiled("**." + deep).matches("b." + deep)


@pytest.mark.compat
def test_doubling_paths_at_most_doubles_the_steps():
    def steps(layers: int) -> int:
        paths = [f"layers.{i}{s}" for i in range(layers) for s in ("", ".attn", ".mlp", ".mlp.fc")]
        index = PathIndex(["", "layers", *paths])
        for pattern in ("layers.*.mlp", "**.fc", "layers.[0-3]", "layers.*", "**", "layers.7.attn",
                        "**.**.**.x", "layers.*.m*.*"):
            index.matching(pattern)
        return index.steps

    small, big = steps(500), steps(1000)
    assert big <= 2.05 * small, (small, big)


@pytest.mark.compat
def test_resolve_indexes_rules():
    """10,000 paths x 1,000 mostly-literal rules: the matcher makes far fewer steps than pairs."""
    paths = [f"layers.{i}{s}" for i in range(1000)
             for s in ("", ".attn", ".attn.q", ".attn.k", ".attn.v", ".mlp", ".mlp.fc1", ".mlp.fc2",
                       ".norm1", ".norm2")]
    rules = {**{f"layers.{i}": "recompute" for i in range(0, 1000, 2)},
             **{f"layers.{i}.attn": {"save": ["attn_out"]} for i in range(0, 1000, 4)},
             **{f"layers.[{a}-{a + 8}]": "offload" for a in range(1, 1000, 10)},
             **{f"**.norm{k}": "inherit" for k in (1, 2)},
             **{"layers.*.mlp.fc1": "inherit", "layers.*.mlp": "inherit"}}
    plan = Plan.from_mapping(rules)
    res = resolve(plan, ["layers", *paths])
    assert len(res.boundaries) == 1000
    assert {"layers.0.attn/attn_out", "attn_out"} <= res.boundary("layers.0").save
    index = PathIndex(["", "layers", *paths])
    for r in plan.rules:
        index.matching(r.pattern)
    assert index.steps < 0.01 * len(paths) * len(plan.rules)


@pytest.mark.compat
def test_resolve_scales_for_rules_that_are_not_literal():
    """1,000 rules that start with '**' or end in a glob, on 10,000 paths: from the front each
    rule visited every module (50 s for '**.*x5'-style rules, 36 s for '**.[0-5].mlp' with its
    range check, 10 s for 'layers.*.m*5'), and each rule that matched nothing scanned every path
    for its nearest paths. Now the index walks such patterns from their last segment."""
    import time

    paths = [f"layers.{i}{s}" for i in range(1000)
             for s in ("", ".attn", ".attn.q", ".attn.k", ".attn.v", ".mlp", ".mlp.fc1", ".mlp.fc2",
                       ".norm1", ".norm2")]
    index = PathIndex(["", "layers", *paths])
    sets = {
        "glob last": [f"**.*x{i}" for i in range(1000)],
        "glob after a literal": [f"layers.*.m*{i}" for i in range(1000)],
        "range after '**'": [f"**.[{i}-{i + 5}].mlp" for i in range(1000)],
        "deep, literal last": ["**.mlp" + ("" if i == 0 else f".fc{i}") for i in range(1000)],
    }
    for name, rules in sets.items():
        before = index.steps
        for r in rules:
            index.matching(r)
        assert index.steps - before < 0.15 * len(paths) * len(rules), name  # it was 1-2 per pair

    def resolve_all(n: int) -> None:  # n rules of each kind on n layers
        few = [f"layers.{i}{s}" for i in range(n) for s in ("", ".attn", ".attn.q", ".mlp",
                                                             ".mlp.fc1", ".mlp.fc2")]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # most rules match nothing: lenient warnings
            for rules in sets.values():
                kinds = {r.replace("1000", str(n)) for r in rules[:n]}
                resolve(Plan.from_mapping(dict.fromkeys(kinds, "recompute"), mode="lenient"),
                        ["layers", *few])

    assert growth(resolve_all, 50) < 7  # rules and paths both 4x: 4.7; the code before: 12.3


@pytest.mark.compat
def test_a_root_boundary_with_names_merged_from_every_layer_is_linear():
    """'.': recompute with names on every layer's attn and mlp: each name of the root boundary was
    worked out by testing every merged rule on every module (7 s on 10,000 modules)."""

    def cost(layers: int) -> None:
        paths = ["layers", *(f"layers.{i}{s}" for i in range(layers)
                             for s in ("", ".attn", ".attn.q", ".mlp", ".mlp.fc1"))]
        plan = Plan.from_mapping({".": "recompute", "layers.*.attn": {"save": ["attn_out"]},
                                  "layers.*.mlp": {"offload": ["h"]}})
        res = resolve(plan, paths)
        assert len(res.boundaries) == 1 and len(res.boundaries[0].save) == 2 * layers + 1

    assert growth(cost, 100) < 7  # 4.0; the code before this test: 15.3


@pytest.mark.compat
def test_layer_groups_of_a_long_stack_take_one_pass():
    """Each layer's signature was a pass over the whole resolution: 2,000 stacked layers took
    1.7 s to group (and as long again for the folded layers), at every trace of the scan."""
    from remat_common.adapter import layer_groups

    def groups(n: int) -> None:
        paths = ["layers", *(f"layers.{i}{s}" for i in range(n) for s in ("", ".attn", ".mlp"))]
        plan = Plan.from_mapping({"layers": "recompute", "layers.*.attn": {"save": ["o"]},
                                  "layers.[3-7]": "offload"})
        res = resolve(plan, paths, stacks=["layers"])
        got = lines_run(layer_groups, res, "layers", n)
        assert [(g.start, g.stop) for g in layer_groups(res, "layers", n)] == [(0, 3), (3, 8), (8, n)]
        counts.append(got)

    counts: list[int] = []
    groups(50)
    groups(200), groups(800)
    assert counts[2] < 7 * counts[1], counts  # 4.0; the code before this test: 15.4


# -- resolve: ranges, relative names, stacks, module paths -----------------------------------------
PATHS4 = ["layers", *(f"layers.{i}{s}" for i in range(4) for s in ("", ".mlp", ".attn"))]


@pytest.mark.compat
@pytest.mark.parametrize("pattern, match", [
    ("layers.[0-5]", r"the range \[0-5\] reaches 4-5, but no such\nmodule exists; the model has "
                     r"indices 0-3 there"),
    ("layers.[2-9].mlp", r"reaches 4-9"),
    ("**.[3-4]", r"\[3-4\] reaches 4"),
])
def test_out_of_range_is_an_error_in_strict_mode(pattern, match):
    with pytest.raises(PlanError, match=match):
        resolve(Plan.from_mapping({pattern: "recompute"}), PATHS4)
    with pytest.warns(rc.UnmatchedPatternWarning, match=match):
        r = resolve(Plan.from_mapping({pattern: "recompute"}, mode="lenient"), PATHS4)
    assert r.boundaries  # what does exist is still annotated


@pytest.mark.compat
def test_huge_and_deep_ranges_say_what_exists():
    with pytest.raises(PlanError, match=r"\[0-999999999999999999\] reaches 999999999999999999, "
                                        r"but no such\nmodule exists; the model has indices 0-3"):
        resolve(Plan.from_mapping({"layers.[0-999999999999999999]": "recompute"}), PATHS4)
    with pytest.raises(PlanError, match=r"reaches 4-1002, 999999999999999999, but no such\nmodule "
                                        r"exists; the model has indices 2-3 there"):
        resolve(Plan.from_mapping({"**.[2-999999999999999999]": "recompute"}), PATHS4)


@pytest.mark.compat
def test_non_ascii_digits_are_not_layer_indices():
    paths = ["layers", "layers.0", "layers.\u00b2"]  # '²'.isdigit() is True, int('²') fails
    with pytest.warns(rc.UnmatchedPatternWarning, match=r"reaches 1-3"):
        r = resolve(Plan.from_mapping({"layers.[0-3]": "recompute"}, mode="lenient"), paths)
    assert [b.path for b in r.boundaries] == ["layers.0"]
    assert PathIndex(["", *paths]).matching("layers.[0-1]") == ("layers.0",)
    stacked = resolve(Plan.from_mapping({"layers": "recompute"}), paths, stacks=["layers"])
    assert [b.path for b in stacked.boundaries] == ["layers.0"]  # '²' is not a layer of the stack


@pytest.mark.compat
@pytest.mark.parametrize("name", ["mlpp/h", "attn.q/h", "*.mlp/h"])
def test_relative_name_matching_nothing_is_an_error(name):
    plan = {"layers.*": {"save": [name]}}
    with pytest.raises(PlanError, match=rf"(?s)relative name '{re.escape(name)}' .* matches no "
                                        r"module.*Descendants: '(attn|mlp)'.*Fix"):
        resolve(Plan.from_mapping(plan), PATHS4)
    with pytest.warns(rc.UnmatchedPatternWarning, match="matches no module"):
        resolve(Plan.from_mapping(plan, mode="lenient"), PATHS4)
    ok = resolve(Plan.from_mapping({"layers.*": {"save": ["mlp/h"]}}), PATHS4)
    assert "layers.1.mlp/h" in ok.boundary("layers.1").save


@pytest.mark.compat
def test_unknown_stack_is_refused():
    with pytest.raises(PlanError, match=r"stack\(s\) 'blocks' are not module paths.*'layers'"):
        resolve(Plan.from_mapping({"layers": "recompute"}), PATHS4, stacks=["blocks"])


@pytest.mark.compat
@pytest.mark.parametrize("path", ["a..b", "a/b", ".a", "a.", "a.b/h"])
def test_resolve_refuses_malformed_module_paths(path):
    with pytest.raises(PlanError, match=rf"resolve: module path {re.escape(repr(path))} is malformed"
                       r"(.|\n)*Fix: pass the model's paths as an adapter lists them") as info:
        resolve(Plan.from_mapping({"a": "recompute"}), ["a", path])
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.compat
def test_a_lenient_warning_does_not_suggest_lenient_mode():
    plan = Plan.from_mapping({"x.y": "recompute", "layers.[0-5]": "recompute"}, mode="lenient")
    with pytest.warns(rc.UnmatchedPatternWarning) as caught:
        resolve(plan, ["layers", "layers.0"])
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2 and all("lenient to only warn" not in t for t in texts)
    assert all(t.endswith("(defaults.mode is lenient: a warning, not an error.)") for t in texts)
    with pytest.raises(PlanError, match=r"or set\ndefaults.mode: lenient to only warn"):
        resolve(Plan.from_mapping({"x.y": "recompute"}), ["layers", "layers.0"])  # strict: it may
