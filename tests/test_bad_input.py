"""Bad input never crashes, hangs or passes silently (issue 13).

The cases are generated: every wrong type at every position of a plan in every file format,
duplicate keys in every position, malformed patterns and ranges, misuse of each public function,
and files that are not plan files. Each case asserts the error type and what the message says
(the value, where it came from, what is allowed or the fix), or the behaviour. Scale cases count
the matcher's steps instead of timing it. No JAX compilation happens here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

import remat_common as rc
from remat_common import AnnotationError, Plan, PlanError, RematError, resolve
from remat_common.adapter import path_matches
from remat_common.internal import PathIndex, compiled, parse_pattern, short

from fixtures.work import growth, lines_run

MAX_MESSAGE = 700  # every message stays short, whatever the input


# -- writing a config in each format -------------------------------------------------------------
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def _toml(config: dict[str, Any]) -> str:
    out = []
    for key, value in config.items():
        if isinstance(value, dict) and key in ("defaults", "rules"):
            out.append(f"[{key}]")
            out += [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()]
        else:
            out.append(f"{key} = {_toml_value(value)}")
    return "\n".join(out) + "\n"


def _write(tmp_path: Path, fmt: str, config: Any) -> Path:
    path = tmp_path / f"plan.{fmt}"
    if fmt == "yaml":
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    elif fmt == "json":
        path.write_text(json.dumps(config, indent=1))
    else:
        path.write_text(_toml(config))
    return path


def _has_none(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, dict):
        return any(_has_none(k) or _has_none(x) for k, x in v.items())
    if isinstance(v, list):
        return any(_has_none(x) for x in v)
    return False


# -- every wrong type at every position ------------------------------------------------------------
WRONG: dict[str, Any] = {
    "int": 3, "float": 1.5, "bool": True, "none": None, "list": ["a", "b"],
    "dict": {"k": "v"}, "str": "bogus",
}

# position -> (build the config around a value, the wrong-value kinds that are really wrong,
#              what the message must say)
POSITIONS: dict[str, tuple[Any, tuple[str, ...], str]] = {
    "top": (lambda v: v, ("int", "float", "bool", "list", "str"),
            r"top-level keys 'defaults', 'rules'"),
    "defaults": (lambda v: {"defaults": v, "rules": {"a": "save"}},
                 ("int", "float", "bool", "list", "str"), r"'defaults' must be a mapping"),
    "defaults.mode": (lambda v: {"defaults": {"mode": v}, "rules": {"a": "save"}},
                      tuple(WRONG), r"unknown mode .*Allowed: 'lenient', 'strict'"),
    "defaults.strict": (lambda v: {"defaults": {"strict": v}, "rules": {"a": "save"}},
                        ("int", "float", "none", "list", "dict", "str"),
                        r"strict must be true or false"),
    "defaults.nesting": (lambda v: {"defaults": {"nesting": v}, "rules": {"a": "save"}},
                         ("int", "float", "none", "list", "dict", "str"),
                         r"nesting must be true or false"),
    "defaults.offload_src": (lambda v: {"defaults": {"offload_src": v}, "rules": {"a": "save"}},
                             ("int", "float", "bool", "none", "list", "dict"),
                             r"memory kind"),
    "defaults.offload_dst": (lambda v: {"defaults": {"offload_dst": v}, "rules": {"a": "save"}},
                             ("int", "float", "bool", "none", "list", "dict"),
                             r"memory kind"),
    "rules": (lambda v: {"rules": v}, ("int", "float", "bool", "none", "str"),
              r"'rules' must be a mapping"),
    "annotation": (lambda v: {"rules": {"a": v}}, tuple(WRONG),
                   r"plan\.\w+:\d+\).*(unknown remat annotation|unknown key|names no)"),
    "annotation.remat": (lambda v: {"rules": {"a": {"remat": v}}}, tuple(WRONG),
                         r"plan\.\w+:\d+\).*unknown remat annotation"),
    "annotation.save": (lambda v: {"rules": {"a": {"save": v}}},
                        ("int", "float", "bool", "none", "dict"),
                        r"plan\.\w+:\d+\).*'save'.*must be a list of activation names"),
    "annotation.save[0]": (lambda v: {"rules": {"a": {"save": [v]}}},
                           ("int", "float", "bool", "none", "list", "dict"),
                           r"plan\.\w+:\d+\).*activation name .* must be a non-empty string"),
    "annotation.offload": (lambda v: {"rules": {"a": {"offload": v}}},
                           ("int", "float", "bool", "none", "dict"),
                           r"plan\.\w+:\d+\).*'offload'.*must be a list of activation names"),
    "annotation.offload_dst": (lambda v: {"rules": {"a": {"offload": ["x"], "offload_dst": v}}},
                               ("int", "float", "bool", "list", "dict"),
                               r"plan\.\w+:\d+\).*offload_dst.*memory kind"),
    "list_rule": (lambda v: {"rules": [v]}, ("int", "float", "bool", "none", "str"),
                  r"plan\.\w+:\d+: cannot read rule"),
    "list_rule.pattern": (lambda v: {"rules": [{"pattern": v, "remat": "save"}]},
                          ("int", "float", "bool", "none", "list", "dict"),
                          r"plan\.\w+:\d+: empty or non-string path pattern"),
    "list_rule.remat": (lambda v: {"rules": [{"pattern": "a", "remat": v}]}, tuple(WRONG),
                        r"plan\.\w+:\d+\).*(unknown remat annotation|unknown key|names no)"),
}

CASES = [
    pytest.param(fmt, pos, kind, id=f"{fmt}-{pos}-{kind}")
    for fmt in ("yaml", "toml", "json")
    for pos, (_, kinds, _) in POSITIONS.items()
    for kind in kinds
    # TOML has no null, and its top level is always a table
    if not (fmt == "toml" and (kind == "none" or pos == "top"))
]


@pytest.mark.compat
@pytest.mark.parametrize("fmt, pos, kind", CASES)
def test_every_wrong_type_at_every_position(tmp_path, fmt, pos, kind):
    build, _, expected = POSITIONS[pos]
    config = build(WRONG[kind])
    if fmt == "toml" and _has_none(config):
        pytest.skip("TOML cannot write null")
    path = _write(tmp_path, fmt, config)
    with pytest.raises(RematError) as info:
        Plan.load(path)
    msg = str(info.value)
    assert re.search(expected, msg, re.S), msg
    assert str(path) in msg  # where it came from
    assert len(msg) < MAX_MESSAGE, msg
    if kind == "bool" and pos in ("annotation", "annotation.remat", "list_rule.remat"):
        assert "YAML 1.1 reads unquoted on/off" in msg


@pytest.mark.compat
@pytest.mark.parametrize("fmt", ["yaml", "json"])
@pytest.mark.parametrize("where, text_yaml, text_json", [
    ("top", "rules: {a: save}\nrules: {b: save}\n",
     '{"rules": {"a": "save"},\n "rules": {"b": "save"}}'),
    ("defaults", "defaults: {mode: strict, mode: lenient}\nrules: {a: save}\n",
     '{"defaults": {"mode": "strict",\n "mode": "lenient"}, "rules": {"a": "save"}}'),
    ("rules", "rules:\n  a: save\n  a: recompute\n",
     '{"rules": {"a": "save",\n "a": "recompute"}}'),
    ("annotation", "rules:\n  a: {save: [x], save: [y]}\n",
     '{"rules": {"a": {"save": ["x"],\n "save": ["y"]}}}'),
    ("list rule", "rules:\n  - {pattern: a, remat: save, remat: recompute}\n",
     '{"rules": [{"pattern": "a", "remat": "save",\n "remat": "recompute"}]}'),
])
def test_duplicate_keys_are_refused_everywhere(tmp_path, fmt, where, text_yaml, text_json):
    path = tmp_path / f"dup.{fmt}"
    path.write_text(text_yaml if fmt == "yaml" else text_json)
    with pytest.raises(PlanError, match=rf"dup\.{fmt}:\d+: .*appears twice.*first at line \d+"):
        Plan.load(path)


@pytest.mark.compat
@pytest.mark.parametrize("text", [
    "[rules]\n\"a\" = \"save\"\n\"a\" = \"recompute\"\n",
    "[defaults]\nmode = \"strict\"\nmode = \"lenient\"\n[rules]\n\"a\" = \"save\"\n",
    "[rules]\n\"a\" = { save = [\"x\"], save = [\"y\"] }\n",
])
def test_duplicate_keys_toml(tmp_path, text):
    path = tmp_path / "dup.toml"
    path.write_text(text)
    with pytest.raises(PlanError, match=r"dup\.toml: invalid TOML"):
        Plan.load(path)


# -- silently-wrong values that are now refused ----------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("defaults, match", [
    ({"strict": "false"}, r"strict must be true or false.*got str 'false'"),
    ({"mode": "lenient", "strict": True}, r"mode: lenient and strict: true disagree"),
    ({"nesting": "false"}, r"nesting must be true or false"),
    ({"offload_src": "pinned_host", "offload_dst": "device"}, r"does not move activations off"),
    ({"offload_src": "device", "offload_dst": "device"}, r"does not move activations off"),
])
def test_defaults_are_validated(defaults, match):
    with pytest.raises(RematError, match=match):
        Plan.from_mapping({"a": "save"}, **defaults)
    with pytest.raises(RematError, match=match):
        Plan.from_config({"defaults": defaults, "rules": {"a": "save"}}, source="p.yaml")


@pytest.mark.compat
@pytest.mark.parametrize("kwargs, match", [
    ({"strict": "no"}, r"Plan: strict must be True or False; got str 'no'"),
    ({"nesting": "false"}, r"Plan: nesting must be True or False; got str 'false'"),
    ({"strict": 1}, r"Plan: strict must be True or False; got int 1"),
    ({"offload_src": "pinned_host", "offload_dst": "device"}, r"does not move activations"),
])
def test_plan_fields_are_type_checked(kwargs, match):
    with pytest.raises((TypeError, AnnotationError), match=match):
        Plan(**kwargs)


@pytest.mark.compat
@pytest.mark.parametrize("value, match", [
    ({"save": []}, r"names no activations \(its lists are empty\).*'recompute'"),
    ({"save": [], "offload": []}, r"names no activations"),
    ({"offload": ["x"], "offload_dst": "device"}, r"does not move activations off the device"),
    ({"offload": ["x"], "offload_src": "pinned_host", "offload_dst": "device"},
     r"offload_src='pinned_host', offload_dst='device'"),
    ({"remat": "offload", "offload_dst": "device"}, r"does not move activations"),
    ({"save": ["mlp/"]}, r"relative name 'mlp/' .* is malformed"),
    ({"save": ["/h"]}, r"relative name '/h' .* is malformed"),
    ({"save": ["mlp//h"]}, r"relative name 'mlp//h' .* is malformed"),
    ({"save": ["a..b/h"]}, r"relative name 'a\.\.b/h' .* is malformed"),
    (False, r"unknown remat annotation False.*YAML 1\.1.*quote it: 'off'"),
    ({"remat": True}, r"unknown remat annotation True.*YAML 1\.1"),
    ({"save": [False]}, r"activation name False.*YAML 1\.1"),
])
def test_annotations_that_were_silently_accepted(value, match):
    with pytest.raises(AnnotationError, match="(?s)" + match):
        rc.parse_annotation(value, path="layers.0", source="plan.yaml:3")


@pytest.mark.compat
def test_yaml_off_names_file_line_and_the_fix(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  layers.*: recompute\n  layers.0: off\n")
    with pytest.raises(AnnotationError, match=r"(?s)p\.yaml:3\): unknown remat annotation False.*"
                                              r"YAML 1\.1 reads unquoted on/off.*quote it"):
        Plan.load(path)


@pytest.mark.compat
def test_toml_unquoted_dotted_key_says_quote_it(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[rules]\nlayers.0 = \"recompute\"\n")
    with pytest.raises(PlanError, match=r"TOML reads an unquoted dotted key.*quote the pattern: "
                                        r"\"layers\.0\" = "):
        Plan.load(path)


@pytest.mark.compat
@pytest.mark.parametrize("item, match", [
    ({"pattern": "a"}, r"lacks 'remat'"),
    ({"remat": "save"}, r"lacks 'pattern'"),
    ({"pattern": "a", "remat": "save", "extra": 1}, r"has extra 'extra'"),
    ({"a": "save", "b": "save"}, r"must be \{pattern: annotation\}"),
])
def test_list_rules_name_the_missing_field(item, match):
    with pytest.raises(PlanError, match=match):
        Plan.from_config({"rules": [item]}, source="p.yaml")


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


# -- resolve: ranges, relative names, stacks, types -------------------------------------------------
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
@pytest.mark.parametrize("call, match", [
    (lambda: resolve({"a": "save"}, ["a"]), r"resolve: plan must be a remat_common.Plan; got dict"),
    (lambda: resolve(None, ["a"]), r"resolve: plan must be .*got NoneType None"),
    (lambda: resolve(Plan(), "layers.0"), r"resolve: paths must be a list.*got str 'layers.0'.*"
                                          r"Fix: pass \['layers.0'\]"),
    (lambda: resolve(Plan(), None), r"resolve: paths must be a list.*got NoneType"),
    (lambda: resolve(Plan(), {"a": 1}), r"resolve: paths must be a list.*got dict"),
    (lambda: resolve(Plan(), [1, 2]), r"resolve: each of paths must be a dotted module path"),
    (lambda: resolve(Plan(), ["layers"], stacks="layers"), r"resolve: stacks must be a list"),
    (lambda: rc.compile_plan(None), r"compile_plan: resolution must be a remat_common.Resolution"),
    (lambda: rc.compile_plan(Plan()), r"compile_plan: resolution must be .*got Plan"),
    (lambda: rc.compile_plan(resolve(Plan(), ["a"]), share_alike_layers="yes"),
     r"compile_plan: share_alike_layers must be True or False; got str 'yes'"),
    (lambda: rc.checkpoint(lambda x: x, prevent_cse="no"),
     r"remat_common.checkpoint: prevent_cse must be True or False; got str 'no'.*not read as "),
    (lambda: rc.verify(lambda x: x, 1.0, plan=None), r"verify: plan must be a .*CompiledPlan"),
    (lambda: rc.verify(lambda x: x, 1.0, plan=Plan()), r"verify: plan must be .*got Plan"),
    (lambda: Plan({"a": "save"}), r"Plan: rules must be a tuple of remat_common.Rule; got dict"
                                  r".*Plan.from_mapping"),
    (lambda: Plan(rules=[("a", "save")]), r"Plan: rules must be a tuple"),
    (lambda: Plan.from_mapping([("a", "save")]), r"Plan.from_mapping: rules must be a mapping"),
    (lambda: Plan.from_rules("abc"), r"Plan.from_rules: rules must be a list"),
    (lambda: Plan.from_rules(3), r"Plan.from_rules: rules must be a list.*got int 3"),
    (lambda: Plan.coerce(3), r"cannot make a plan from int 3"),
    (lambda: Plan.coerce(b"x"), r"cannot make a plan from bytes"),
    (lambda: Plan.load(3), r"Plan.load: path must be a file path"),
    (lambda: rc.Rule("a", "save"), r"Rule: annotation must be an Annotation"),
    (lambda: rc.adapter.check_targets(None, [], {}), r"check_targets: plan must be"),
    (lambda: rc.adapter.check_targets(Plan(), "mlp", {}), r"check_targets: module_paths must be a list"),
])
def test_api_misuse_is_a_type_error_naming_the_function(call, match):
    with pytest.raises(TypeError, match=match) as info:
        call()
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.compat
@pytest.mark.parametrize("name", ["", " h", "h ", "a/b", "h\x00", "__input__", "__rule__", 3, None])
def test_checkpoint_name_refuses_names_a_plan_cannot_mean(name):
    """' h' can never be named by a plan (plan names have no surrounding spaces); '__input__' is
    the core's own tag of a module's offloaded input, so a user's value of that name would be
    offloaded with it."""
    import jax.numpy as jnp

    with pytest.raises(ValueError, match=r"checkpoint_name: name must be a non-empty string .*"
                                         r"not '__input__' or '__rule__'"):
        rc.checkpoint_name(jnp.ones(2), name)


@pytest.mark.compat
@pytest.mark.parametrize("name", ["*", "h*", "*_out"])
def test_checkpoint_name_refuses_a_star_no_plan_may_name(name):
    """'*' was accepted, though a plan refuses '*' in a name (its resolver's '*' is every name):
    nothing could keep or offload the value by name."""
    import jax
    import jax.numpy as jnp

    with pytest.raises(ValueError, match=rf"checkpoint_name: name '{re.escape(name)}' contains '\*', "
                       r"which no plan may\s+name(.|\n)*Fix: a name without '\*'"):
        rc.checkpoint_name(jnp.ones(2), name)
    f = rc.checkpoint(lambda x: jnp.sum(jnp.sin(rc.checkpoint_name(x * 2, "h"))), {"save": ["h"]})
    assert rc.saved_residuals(f, jnp.ones(2)).names() == {"h"}  # the fix: a plain name, kept
    assert float(jax.grad(f)(jnp.zeros(2))[0]) == 2.0


@pytest.mark.compat
@pytest.mark.parametrize("call, match", [
    (lambda: rc.verify(lambda x: x, 1.0, plan=rc.compile_plan(resolve(Plan(), [])), strict="no"),
     r"verify: strict must be True or False; got str 'no'"),  # 'no' was strict
    (lambda: rc.saved_residuals(3, 1.0), r"saved_residuals: fun must be a function; got int 3"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, steps="3"),
     r"measure: steps must be an integer >= 0, got str '3'"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, warmup=1.5),
     r"measure: warmup must be an integer >= 0, got float"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, placement="yes"),
     r"measure: placement must be True, False or None"),
    (lambda: rc.measurement.measure(_never_built, {"a": None}, check_layouts="no"),
     r"measure: check_layouts must be True or False; got str 'no'"),
])
def test_measure_and_verify_arguments(call, match):
    with pytest.raises(RematError, match=match):
        call()


@pytest.mark.compat
def test_an_annotation_given_as_the_plan_says_so():
    with pytest.raises(PlanError, match=r"plan file 'recompute': unknown format ''.*'recompute' is "
                                        r"an annotation, not a plan: for the whole model write "
                                        r"\{'\.': 'recompute'\}"):
        Plan.coerce("recompute")  # annotate(model, "recompute")


@pytest.mark.compat
def test_unknown_stack_is_refused():
    with pytest.raises(PlanError, match=r"stack\(s\) 'blocks' are not module paths.*'layers'"):
        resolve(Plan.from_mapping({"layers": "recompute"}), PATHS4, stacks=["blocks"])


@pytest.mark.compat
def test_checkpoint_custom_on_a_plain_function_is_refused():
    with pytest.raises(PlanError, match=r"annotation 'custom' on .*plain function has none.*Fix"):
        rc.checkpoint(lambda x: x, "custom")
    with pytest.raises(PlanError, match=r"annotation 'custom'"):
        rc.checkpoint({"remat": "custom"})


# -- round 2 (issue 27): names, module paths and arguments that passed silently or crashed ----------

@pytest.mark.compat
@pytest.mark.parametrize("annotation", [{"save": ["*"]}, {"offload": ["*"]}, {"save": ["mlp/*"]},
                                        {"save": ["h"], "offload": ["attn_*"]}])
def test_a_glob_as_a_name_is_refused(annotation):
    """``"*"`` kept nothing and strict checks passed (the resolver uses it for every name)."""
    key = "save" if "*" in "".join(annotation.get("save", [])) else "offload"
    with pytest.raises(AnnotationError, match=r"is a glob: names are matched exactly(.|\n)*Fix: list "
                       rf"the tagged names \({key}: \[attn_out, \.\.\.\]\), or annotate the module "
                       rf"'{'save' if key == 'save' else 'offload'}'") as info:
        Plan.from_mapping({"layers.*": annotation})
    assert len(str(info.value)) < MAX_MESSAGE
    with pytest.raises(AnnotationError, match="is a glob"):
        rc.checkpoint(lambda x: x, annotation)
    assert Plan.from_mapping({"layers.*": {"save": ["*.mlp/h"]}})  # a glob sub-path stays allowed


@pytest.mark.compat
@pytest.mark.parametrize("path", ["a..b", "a/b", ".a", "a.", "a.b/h"])
def test_resolve_refuses_malformed_module_paths(path):
    with pytest.raises(PlanError, match=rf"resolve: module path {re.escape(repr(path))} is malformed"
                       r"(.|\n)*Fix: pass the model's paths as an adapter lists them") as info:
        resolve(Plan.from_mapping({"a": "recompute"}), ["a", path])
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.compat
def test_arguments_that_contain_themselves_are_refused_not_a_crash():
    """A cycle made ``jax.tree_util`` recurse until the interpreter died."""
    import jax.numpy as jnp

    loop: list[Any] = [jnp.ones(2)]
    loop.append(loop)
    for call in (lambda: rc.saved_residuals(lambda v: jnp.sum(v[0]), loop),
                 lambda: rc.verify(lambda v: jnp.sum(v[0]), loop,
                                   plan=rc.compile_plan(resolve(Plan(), [])))):
        with pytest.raises(TypeError, match=r"the arguments hold a reference cycle:\nthe list at "
                           r"args\[0\] \(again at args\[0\]\[1\]\) contains itself \(a list that holds "
                           r"itself through its items\)"):
            call()


def test_nnx_child_holding_its_parent_is_refused_and_the_fix_works():
    pytest.importorskip("flax")
    import jax.numpy as jnp
    from flax import nnx

    import flax_remat_plugin as frp

    class Child(nnx.Module):
        def __init__(self, parent: nnx.Module, rngs: nnx.Rngs) -> None:
            self.parent = parent
            self.lin = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return jnp.tanh(self.lin(x))

    class Parent(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.child = Child(self, rngs)

        def __call__(self, x: Any) -> Any:
            return self.child(x)

    model = frp.annotate(Parent(nnx.Rngs(0)), {"child": "recompute"})
    loss = lambda m, x: jnp.sum(m(x))  # noqa: E731
    with pytest.raises(TypeError, match=r"verify: the arguments hold a reference cycle:\nthe "
                       r"Parent at args\[0\] \(again at args\[0\]\.child\.parent\) contains itself \(a "
                       r"child module that keeps a reference to its parent\?\)(.|\n)*nnx\.split"):
        rc.verify(loss, model, jnp.ones(4), plan=frp.compiled_plan(model))
    graphdef, state = nnx.split(model)  # the fix the message names
    check = rc.verify(lambda s, x: loss(nnx.merge(graphdef, s, copy=True), x), state, jnp.ones(4),
                      plan=frp.compiled_plan(model), strict=True)
    assert check.ok


def test_dict_keys_with_a_slash_or_a_dot_are_refused_in_both_adapters():
    pytest.importorskip("flax")
    eqx = pytest.importorskip("equinox")
    import jax
    from flax import nnx

    import equinox_remat_plugin as erp
    import flax_remat_plugin as frp

    class Heads(nnx.Module):
        def __init__(self, key: str) -> None:
            self.heads = nnx.Dict({key: nnx.Linear(2, 2, rngs=nnx.Rngs(0))})

    class EHeads(eqx.Module):
        heads: dict[str, Any]

        def __init__(self, key: str) -> None:
            self.heads = {key: eqx.nn.Linear(2, 2, key=jax.random.key(0))}

    for key in ("a/b", "a.b"):
        with pytest.raises(PlanError, match=rf"module 'heads': child key {re.escape(repr(key))} cannot "
                           r"be written(.|\n)*'/' a path from an activation name(.|\n)*Fix: rename"):
            frp.annotate(Heads(key), {"heads": "recompute"})
        with pytest.raises(PlanError, match=rf"the dict key {re.escape(repr(key))} under 'heads' "
                           r"contains '\.' or '/'(.|\n)*Fix: use other keys"):
            erp.annotate(EHeads(key), {"heads": "recompute"})
    assert frp.module_paths(Heads("a_b")) == ("", "heads", "heads.a_b")  # the fix: another key
    assert erp.module_paths(EHeads("a_b")) == ("", "heads.a_b")


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


# -- files that are not plan files ------------------------------------------------------------------
@pytest.mark.compat
def test_files_that_are_not_plan_files(tmp_path, monkeypatch):
    (tmp_path / "latin1.yaml").write_bytes(b"rules:\n  caf\xe9: save\n")
    with pytest.raises(PlanError, match=r"latin1\.yaml:2: plan file is not UTF-8 text \(byte 0xe9"):
        Plan.load(tmp_path / "latin1.yaml")
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(PlanError, match=r"'.*dir\.yaml' is a directory"):
        Plan.load(tmp_path / "dir.yaml")
    os.symlink(tmp_path / "loop.yaml", tmp_path / "loop.yaml")
    with pytest.raises(PlanError, match=r"is a symbolic link loop"):
        Plan.load(tmp_path / "loop.yaml")
    with pytest.raises(PlanError, match=r"does not exist"):
        Plan.load(tmp_path / "missing.toml")
    big = tmp_path / "big.json"
    big.write_text('{"rules": {"a": "save"}}' + " " * 2000)
    monkeypatch.setattr("remat_common._plan.MAX_PLAN_BYTES", 1000)  # the limit, patched where it is read
    with pytest.raises(PlanError, match=r"big\.json' is 0\.0 MiB; at most 0 MiB are read.*globs"):
        Plan.load(big)


@pytest.mark.compat
@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_device_file(tmp_path):
    os.symlink("/dev/null", tmp_path / "null.yaml")
    with pytest.raises(PlanError, match=r"is not a regular file \(a device, FIFO or socket\)"):
        Plan.load(tmp_path / "null.yaml")


@pytest.mark.compat
@pytest.mark.parametrize("text, match", [
    ('{"rules": {"a": "save"},\n\n "x": }', r"p\.json:3: invalid JSON: Expecting value"),
    ('{"rules": {\n"a": "sav"}}', r"module 'a' \(.*p\.json:2\): unknown remat annotation 'sav'"),
    ('{"rules": [\n{"pattern": "a",\n "remat": "x"}]}', r"p\.json:2\): unknown remat annotation"),
    ("[" * 100_000, r"p\.json: JSON nested too deeply"),
])
def test_json_errors_carry_the_line(tmp_path, text, match):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(RematError, match=match):
        Plan.load(path)


@pytest.mark.compat
@pytest.mark.parametrize("name, text, match", [
    ("p.toml", "[rules]\na = " + "[" * 100_000 + "]" * 100_000 + "\n", r"p\.toml: TOML nested too "
                                                                      r"deeply"),  # RecursionError
    ("p.toml", "[rules]\na = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n", r"TOML nested too deeply"),
    ("p.yaml", "rules:\n  a: " + "[" * 100_000 + "]" * 100_000 + "\n", r"p\.yaml:2: invalid YAML: "
                                                                      r"exceeded maximum nesting"),
    # int() refuses more than 4,300 digits with a ValueError that told to raise Python's limit
    ("p.json", '{"rules": {"a": ' + "9" * 5000 + "}}", r"p\.json: invalid JSON: a number of more "
                                                       r"than 4,300 digits.*Fix: remove it"),
    ("p.yaml", "rules:\n  a: " + "9" * 5000 + "\n", r"p\.yaml:2: invalid YAML: a number of more "
                                                     r"than 4,300 digits"),
    ("p.toml", "[rules]\na = " + "9" * 5000 + "\n", r"p\.toml: invalid TOML: a number of more than"),
])
def test_deep_and_huge_values_in_every_format(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PlanError, match=match) as info:
        Plan.load(path)
    assert "set_int_max_str_digits" not in str(info.value)


@pytest.mark.compat
@pytest.mark.parametrize("key, match", [
    ("0", r"pattern 0 \(int\)\. A plan file reads an unquoted 0, .*quote it \('0'\)"),
    ("1.5", r"pattern 1\.5 \(float\).*quote it \('1\.5'\)"),
    ("on", r"pattern True \(bool\).*quote it \(the word you wrote\)"),
    ("null", r"pattern None \(NoneType\).*quote it"),
])
def test_unquoted_yaml_keys_that_are_not_strings(tmp_path, key, match):
    path = tmp_path / "p.yaml"
    path.write_text(f"rules:\n  {key}: recompute\n")
    with pytest.raises(PlanError, match=r"p\.yaml:2: empty or non-string path " + match):
        Plan.load(path)


@pytest.mark.compat
def test_toml_rule_lines(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[defaults]\nmode = "strict"\n\n[rules]\n"a" = "save"\n# c\nb = "recompute"\n'
                    "'c.d' = \"offload\"\n")
    assert [r.source.rsplit(":", 1)[1] for r in Plan.load(path).rules] == ["5", "7", "8"]


@pytest.mark.compat
def test_yaml_alias_bomb_is_refused_quickly_with_a_short_message(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nrules:\n  x: *i\n")
    with pytest.raises(PlanError, match=r"bomb\.yaml:\d+: the YAML aliases .* alias bomb") as info:
        Plan.load(path)
    assert len(str(info.value)) < MAX_MESSAGE
    # a harmless alias is fine
    ok = tmp_path / "ok.yaml"
    ok.write_text("rules:\n  a: &r {save: [x]}\n  b: *r\n")
    assert [str(r.annotation) for r in Plan.load(ok).rules] == ["{'save': ['x'], 'offload': []}"] * 2


@pytest.mark.compat
def test_recursive_yaml_alias(tmp_path):
    path = tmp_path / "rec.yaml"
    path.write_text("rules:\n  a: &x {save: *x}\n")
    with pytest.raises(PlanError, match=r"rec\.yaml:\d+: a YAML alias refers to a value that contains"):
        Plan.load(path)


@pytest.mark.compat
@pytest.mark.parametrize("text", [
    "a: 1\nb: [1, 2.5, true, off, null, ~, 0x1f, 1_000, 2024-01-01, '3', \"x\", !!str 1, !!int '3']\n",
    "base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n",
    "base: &b {x: 1}\nb2: &c {x: 5, z: 1}\nd:\n  <<: [*b, *c]\n",
    "s: !!set {a, b}\no: !!omap [{a: 1}, {b: 2}]\nbin: !!binary aGVsbG8=\n",
    "- a\n- b\n", "", "# a comment\n", "---\na: |\n  two\n  lines\n...\n", "? a\n: 1\n'<<': 2\n",
    "x: &a [1, 2]\ny: *a\n",
])
def test_yaml_reads_what_safe_loader_reads(text):
    """Plan files are read from the parser's events (PyYAML's node graph cost 14 s for 10 MB of
    list rules); the data is the same as yaml.safe_load's."""
    from remat_common.internal import load_yaml

    assert load_yaml(text, "p.yaml")[0] == yaml.safe_load(text)


@pytest.mark.compat
@pytest.mark.parametrize("text, match", [
    ("a: 1\n---\nb: 2\n", r"p\.yaml:2: invalid YAML: the file holds more than one document"),
    ("a: &x 1\nb: &x 2\n", r"p\.yaml:2: the YAML anchor &x is defined twice"),
    ("a: *nope\n", r"p\.yaml:1: invalid YAML: the alias \*nope refers to no anchor"),
    ("? [a]\n: 1\n", r"p\.yaml:1: a YAML mapping key must be a scalar, got list"),
    ("x: !foo 1\n", r"p\.yaml:1: invalid YAML: could not determine a constructor for the tag '!foo'$"),
    ("x: !!python/object:os.system 1\n", r"tag 'tag:yaml\.org,2002:python/object:os\.system'$"),
    ("x: !custom {a: 1}\n", r"p\.yaml:1: YAML tag '!custom' is not supported here"),
    ("x: !!map 3\n", r"p\.yaml:1: YAML tag 'tag:yaml\.org,2002:map' on a scalar"),
    ("d:\n  <<: 3\n", r"p\.yaml:2: a YAML merge key \(<<\) takes a mapping .*got int 3"),
    ("1: a\ntrue: b\n", r"p\.yaml:2: key True appears twice in one mapping \(first at line 1\)"),
    ("rules:\n  a: save\n  'a': recompute\n", r"p\.yaml:3: pattern 'a' appears twice \(first at "
                                              r"line 2\)"),
])
def test_yaml_refusals_name_the_line(tmp_path, text, match):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PlanError, match=match):
        Plan.load(path)


@pytest.mark.compat
def test_yaml_list_rules_carry_the_line_of_each_item(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - pattern: a\n    remat: save\n\n  - pattern: b\n    remat: bogus\n")
    with pytest.raises(AnnotationError, match=r"module 'b' \(.*p\.yaml:5\): unknown remat"):
        Plan.load(path)
    path.write_text("rules:\n  - pattern: a\n    remat: save\n  - {pattern: b, remat: recompute}\n")
    assert [r.source.rsplit(":", 1)[1] for r in Plan.load(path).rules] == ["2", "4"]


@pytest.mark.compat
@pytest.mark.parametrize("value", [
    "x" * 100_000, ["x"] * 100_000, {f"k{i}": i for i in range(10_000)}, [[[[[[[[1]]]]]]]],
])
def test_huge_values_give_bounded_messages(value):
    with pytest.raises(AnnotationError) as info:
        rc.parse_annotation(value, path="a")
    assert len(str(info.value)) < MAX_MESSAGE
    assert len(short(value)) <= 120


# -- the command line -------------------------------------------------------------------------------
def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from remat_common.internal import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.compat
def test_cli_lint_empty_directory_and_fifo(tmp_path, capsys):
    code, _, err = _cli(["lint", str(tmp_path)], capsys)
    assert code == 2 and "no Python files found" in err and "Traceback" not in err
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "ok.py").write_text("import jax\n")
    code, out, _ = _cli(["lint", str(tmp_path)], capsys)  # the FIFO is skipped, not read (a hang)
    assert code == 0 and "no problems in 1 file(s)" in out
    code, _, err = _cli(["lint", str(tmp_path / "pipe.py")], capsys)
    assert code == 2 and "not a regular file" in err


@pytest.mark.compat
@pytest.mark.parametrize("value", ["", ",", "remat3,", " "])
def test_cli_doctor_empty_require(capsys, value):
    code, _, err = _cli(["doctor", "--require", value], capsys)
    assert code == 2 and "holds an empty feature name" in err


def _report_config(tmp_path: Path, plans: str = "{a: null}", target: str = "t.py:f") -> Path:
    cfg = tmp_path / "report.yaml"
    cfg.write_text(f"target: {target}\nplans: {plans}\n")
    return cfg


#: `remat report` needs the `report` extra (rich, matplotlib); without it, it says so (test_doctor.py).
needs_report = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("rich", "matplotlib")),
    reason="remat report needs the 'report' extra, not installed here")


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("setup, argv, match", [
    (lambda d: _report_config(d, "{a: missing.yaml}"), [], r"plan file '.*missing\.yaml' does not"),
    (lambda d: _report_config(d, "{a: {layers.0: off}}"), [], r"unknown remat annotation False.*YAML"),
    (lambda d: _report_config(d, "{a: {'layers.[0-3]*': save}}"), [], r"not a numeric range"),
    (lambda d: _report_config(d), ["--size", "d=[1"], r"--size d(:\d+)?: invalid YAML"),
    (lambda d: _report_config(d), ["--json", "{dir}"], r"--json '.*' is a directory"),
    (lambda d: _report_config(d), ["--plot", "{dir}"], r"--plot '.*' is a directory"),
    (lambda d: _report_config(d, "{a: null, a: null}"), [], r"appears twice"),
    (lambda d: (d / "x.yaml").write_text("a: [") and d / "x.yaml", [], r"x\.yaml:\d+: invalid YAML"),
    (lambda d: d, [], r"report config '.*' is a directory"),
])
def test_cli_report_errors_without_traceback(tmp_path, capsys, setup, argv, match):
    cfg = setup(tmp_path)
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    code, _, err = _cli(["report", str(cfg), "--no-progress", *argv], capsys)
    assert code == 2, err
    assert re.search(match, err, re.S), err
    assert "Traceback" not in err


@pytest.mark.compat
@needs_report
def test_cli_report_target_import_error(tmp_path, capsys):
    (tmp_path / "t.py").write_text("import numpy\nimport not_a_module_anywhere\n")
    code, _, err = _cli(["report", str(_report_config(tmp_path)), "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in err
    assert re.search(r"importing the target file '.*t\.py' failed: .*t\.py:2: ModuleNotFoundError",
                     err), err


@pytest.mark.compat
@needs_report
def test_cli_report_error_in_the_users_target_code(tmp_path, capsys):
    """An error raised by the target function itself was a traceback through the tool's code."""
    (tmp_path / "t.py").write_text("def f(plan):\n    raise ValueError('boom in user code')\n")
    code, _, err = _cli(["report", str(_report_config(tmp_path)), "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in err
    assert re.search(r"the target .*t\.py:f raised while building the model for plan None \(no "
                     r"plan\): .*t\.py:2: ValueError: boom in user code\. Fix: make f\(plan\) run",
                     err), err


_RAISING_LOSS = """\
import jax, jax.numpy as jnp
from remat_common.measurement import MeasureTarget


def f(plan):
    w, x = jnp.eye(4), jnp.ones((2, 4))

    def loss(w, x):
        h = jnp.tanh(x @ w)
        raise ValueError("boom in the loss")

    def step(w, x):
        return w - 0.1 * jax.grad(loss)(w, x)

    return MeasureTarget(loss, (w, x), step, (w, x), None)
"""


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("command, argv, what", [
    ("report", [], r"measuring plan 'a' \(compile\)"),
    ("tune", ["--budget", "1GiB"], r"measuring the model before any plan \(its first build and "
                                   r"trace, no plan\)"),
])
def test_cli_report_and_tune_error_in_the_users_loss(tmp_path, capsys, command, argv, what):
    """The target builds, but its loss raises while a plan is measured: was a traceback through
    measure and jax.jit."""
    (tmp_path / "t.py").write_text(_RAISING_LOSS)
    code, _, err = _cli([command, str(_report_config(tmp_path)), "--no-progress", *argv], capsys)
    assert code == 2 and "Traceback" not in err
    assert re.search(rf"report\.yaml: the target's code raised while {what}: .*t\.py:10: ValueError: "
                     r"'boom in the loss'\. Fix: make the target's loss and step run on their own: "
                     r"t = f\(plan\) \(plan=None first\), then t\.loss_fn\(\*t\.loss_args\), "
                     r"jax\.grad\(t\.loss_fn\)\(\*t\.loss_args\) \(measuring differentiates the "
                     r"loss with JAX's own transforms, not your framework's\) and "
                     r"jax\.jit\(t\.step_fn\)\(\*t\.step_args\)", " ".join(err.split())), err
    from remat_common.internal import load_function

    t = load_function(tmp_path / "t.py", "f")(None)  # the fix's first step: the full traceback
    with pytest.raises(ValueError, match="boom in the loss") as info:
        t.loss_fn(*t.loss_args)
    assert info.traceback[-1].lineno + 1 == 10 and info.traceback[-1].path.name == "t.py"


@pytest.mark.compat
@needs_report
def test_cli_report_creates_output_folders_before_measuring(tmp_path, capsys):
    out = tmp_path / "new" / "sub" / "report.json"
    cfg = _report_config(tmp_path, "{a: missing.yaml}")  # fails after the outputs are checked
    code, _, err = _cli(["report", str(cfg), "--json", str(out)], capsys)
    assert code == 2 and "does not exist" in err
    assert out.parent.is_dir() and not out.exists()


_TARGET = "def f(plan, *, batch=1, n_layers=4, lr=0.1, act='gelu'):\n    raise AssertionError('built')\n"


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("command", ["report", "tune"])
@pytest.mark.parametrize("config, argv, match", [
    ("plans: {a: null}\nmodel: []\n", [], r"model must be a mapping of keyword arguments, got \[\]"),
    ("plans: {a: null}\nmodel: 0\n", [], r"model must be a mapping"),  # `or {}` read it as {}
    ("plans: {a: null}\nbaseline: [a]\n", [], r"baseline \['a'\] is not one of the plans"),
    ("plans: {a: {layers.0: bogus}}\n", ["--plans", "a"], r"module 'layers.0' \(.*report\.yaml: plans\.a\): "
                                           r"unknown remat annotation 'bogus'"),
    ("plans: {a: {rules: {x: save}, mode: strict}}\n", ["--plans", "a"], r"plans\.a: a full plan has the keys "
                                                          r"'defaults' and 'rules' only"),
    ("plans: {a: null}\n", ["--size", "n_layers=two"], r"n_layers='two' \(str\), but .*t\.py:f "
                                                         r"has n_layers=4 \(int\) as its default"),
    ("plans: {a: null}\n", ["--size", "n_layers=2.5"], r"n_layers=2\.5 \(float\).*Fix: give "
                                                         r"n_layers an int"),
    ("plans: {a: null}\n", ["--size", "act=3"], r"act=3 \(int\), but .* has act='gelu' \(str\)"),
    ("plans: {a: null}\n", ["--json", "{dir}/report.yaml"], r"--json '.*report\.yaml' is '.*report"
                                                            r"\.yaml', which this run reads"),
    ("plans: {a: null}\n", ["--json", "{dir}/t.py"], r"which this run reads: it would be "
                                                     r"overwritten"),  # the target's own source
    ("plans: {a: null}\n", ["--json", "{dir}/fifo.json"], r"--json '.*fifo\.json' cannot be written"),
    ("plans: {a: null}\n", ["--plot", "{dir}/t.py/x.png"], r"--plot '.*': '.*t\.py' is a file, not "
                                                           r"a folder"),
    ("plans: {a: null}\n", ["--plot", "{dir}/out.txt"], r"--plot '.*out\.txt': unknown format "
                                                        r"'\.txt'\. Allowed: '\.png'"),  # it wrote out.txt.png
])
def test_cli_report_and_tune_refuse_before_measuring(tmp_path, capsys, command, config, argv, match):
    (tmp_path / "t.py").write_text(_TARGET)
    os.mkfifo(tmp_path / "fifo.json")  # nobody reads it: opening it to write would block
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\n" + config)
    budget = ["--budget", "1GiB"] if command == "tune" else []
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    code, _, err = _cli([command, str(cfg), "--no-progress", *budget, *argv], capsys)
    assert code == 2, err
    assert re.search(match, err, re.S), err
    assert "Traceback" not in err and "built" not in err
    assert (tmp_path / "t.py").read_text() == _TARGET and cfg.read_text().startswith("target")


@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("argv, match", [
    (["--budget", "-1GiB"], r"argument --budget: budget '-1GiB': a size cannot be negative"),
    ([], r"--budget is required"),
    (["--budget", "1GiB", "--out", "{dir}/plan.toml"], r"--out '.*plan\.toml': unknown format "
                                                      r"'\.toml'\. Allowed: '\.json', '\.yaml'"),
    (["--budget", "1GiB", "--step", "2"], r"--step 2 is used by --maximize, which is not given"),
    (["--budget", "1GiB", "--limit", "9"], r"--limit 9 is used by --maximize"),
    (["--budget", "1GiB", "--measure-steps", "3"], r"--measure-steps 3 is used by --measure"),
    (["--budget", "1GiB", "--maximize", "batch", "--limit", "4"], r"--limit 4 is below the batch "
                                                                   r"the search starts from \(8\)"),
    (["--budget", "1GiB", "--maximize", "seq"], r"--maximize seq: the config sets no seq_len"),
    (["--budget", "1GiB", "--plans", "{dir}/more.toml"], r"--plans .*more\.toml: no such plan "
                                                         r"file"),  # was "no plan named"
])
def test_cli_tune_refuses_before_searching(tmp_path, capsys, argv, match):
    (tmp_path / "t.py").write_text(_TARGET)
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\nbatch: 8\nplans: {a: null}\n")
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    try:
        code, _, err = _cli(["tune", str(cfg), "--no-progress", "--json",
                             str(tmp_path / "out" / "t.json"), *argv], capsys)
    except SystemExit as e:  # argparse's own errors
        code, err = int(e.code or 0), capsys.readouterr().err
    assert code == 2, err
    assert re.search(match, err, re.S), err
    assert "built" not in err
    if not argv:  # the missing budget is found before any output folder is made
        assert not (tmp_path / "out").exists()


@pytest.mark.compat
@pytest.mark.parametrize("flag", ["--steps", "--warmup"])
def test_cli_report_negative_counts(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as info:
        _cli(["report", str(_report_config(tmp_path)), flag, "-1"], capsys)
    assert info.value.code == 2
    assert "-1 is negative" in capsys.readouterr().err


@pytest.mark.compat
def test_cli_survives_a_closed_pipe(tmp_path):
    import subprocess
    import sys

    for i in range(40):
        (tmp_path / f"m{i}.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    proc = subprocess.Popen([sys.executable, "-c", "from remat_common.internal import main; "
                             "import sys; sys.exit(main())", "lint", "--format", "json",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# -- lint ------------------------------------------------------------------------------------------
@pytest.mark.compat
@pytest.mark.parametrize("line, flagged", [
    ("x = jnp.empty(3)", True),
    ("x = jnp.empty(3)  # noqa: RM002", False),
    ("x = jnp.empty(3)  # noqa:RM002,E501", False),
    ("x = jnp.empty(3)  # NOQA: rm002", False),
    ("x = jnp.empty(3)  # noqa: E501", True),
    ("x = jnp.empty(3)  # noqa: RM007", True),
    ("x = jnp.empty(3)  # noqa", False),
    ("x = jnp.empty(3)  # remat: ignore[RM002]", False),
    ("x = '# noqa: RM002' + str(jnp.empty(3))", True),
])
def test_lint_honours_noqa(line, flagged):
    found = rc.lint.lint_source("import jax.numpy as jnp\n" + line + "\n")
    assert bool(found) is flagged


@pytest.mark.compat
@pytest.mark.parametrize("src, flagged", [
    ("a = jnp.empty((3, 4)).at[...].set(1.0)", False),
    ("a = jnp.empty_like(x).at[:].set(x)", False),
    ("a = jnp.empty((3, 4)).at[:, :].set(x)", False),
    ("b = jnp.empty(3)\nb = b.at[...].set(x)", False),
    ("def f(x):\n    e = jnp.empty(x.shape)\n    return e.at[:].set(x)", False),
    ("a = jnp.empty((3, 4)).at[0].set(1.0)", True),
    ("a = jnp.empty((3, 4)).at[:, 0].set(1.0)", True),
    ("a = jnp.empty((3, 4)).at[...].add(1.0)", True),
    ("b = jnp.empty(3)\nc = b + 1\nb = b.at[...].set(x)", True),
    ("b = jnp.empty(3)\nb = b.at[1:].set(x)", True),
    ("b = jnp.empty(3)\nc = b.at[...].set(b)", False),
    ("b = jnp.empty(3)", True),
    ("z = jnp.empty(0, jnp.int32)", False),
    ("z = jnp.empty((0, 3))", False),
    ("z = jnp.empty((1, 3))", True),
    ("p = jnp.empty((), jnp.float32)\nd = jnp.real(p).real.dtype", False),
    ("d = jnp.empty((2,)).dtype", False),
    ("p = jnp.empty(())\nd = p.dtype\ne = p + 1", True),
    ("def f():\n    p = jnp.empty(())\n    return p.shape\np = 3\nq = p + 1", False),
])
def test_lint_empty_filled_at_once_is_not_flagged(src, flagged):
    found = rc.lint.lint_source("import jax.numpy as jnp\n" + src + "\n")
    assert [f.rule for f in found] == (["RM002"] if flagged else [])


@pytest.mark.compat
def test_lint_silences_syntax_warnings_and_survives_deep_code(tmp_path):
    # pytest turns warnings into errors: a SyntaxWarning leaking out would fail here
    assert rc.lint.lint_source('import jax.numpy as jnp\ns = "\\d"\nx = jnp.empty(3)\n')[0].rule == "RM002"
    deep = "import jax\nx = " + "+".join(["1"] * 50_000) + "\n"
    found = rc.lint.lint_source(deep, "deep.py")
    assert all(f.rule == "RM000" and "cannot" in f.message for f in found)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = rc.lint.lint_paths([_write_py(tmp_path, deep)])
    assert report.findings and report.findings[0].rule == "RM000"


def _write_py(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deep.py"
    path.write_text(text)
    return path


@pytest.mark.compat
@pytest.mark.parametrize("call, error, match", [
    # one path given as a string was walked character by character: '/' first, the whole disk
    (lambda d: rc.lint.lint_paths(str(d)), TypeError, r"lint_paths: paths must be a list of files "
                                                      r"and directories; got str .*Fix: pass \['"),
    (lambda d: rc.lint.lint_paths(d), TypeError, r"got PosixPath"),
    (lambda d: rc.lint.lint_paths(None), TypeError, r"got NoneType None"),
    (lambda d: rc.lint.lint_paths([3]), TypeError, r"each of paths must be a file or directory"),
    (lambda d: rc.lint.lint_paths([d], select=""), ValueError, r"select '' names no rule, so "
                                                               r"nothing would be checked"),
    (lambda d: rc.lint.lint_paths([d], select=[]), ValueError, r"names no rule"),
    (lambda d: rc.lint.lint_paths([d], select=3), TypeError, r"select must be rule ids or names"),
    (lambda d: rc.lint.lint_source(b"x = 1\n"), TypeError, r"lint_source: source must be Python "
                                                           r"source text \(str\), got bytes"),
    (lambda d: rc.lint.lint_source(None), TypeError, r"got NoneType"),
])
def test_lint_api_misuse(tmp_path, call, error, match):
    (tmp_path / "m.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    with pytest.raises(error, match=match):
        call(tmp_path)


@pytest.mark.compat
@pytest.mark.parametrize("select", ["", " , "])
def test_cli_lint_empty_select_fails(tmp_path, capsys, select):
    (tmp_path / "m.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    code, _, err = _cli(["lint", str(tmp_path), "--select", select], capsys)
    assert code == 2 and "names no rule, so nothing would be checked" in err  # it passed, exit 0


@pytest.mark.compat
def test_lint_skips_directories_it_may_not_read(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("x = 1\n")
    (tmp_path / "locked").mkdir()
    real = Path.is_file

    def is_file(self: Path) -> bool:  # what root meets in /proc/1/fdinfo
        if self.parent.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    assert [Path(f).name for f in rc.lint.lint_paths([tmp_path]).files] == ["m.py"]


@pytest.mark.compat
def test_lint_says_which_directories_it_could_not_list(tmp_path, monkeypatch):
    """A directory os.walk cannot list (no permission; root is never refused, so the refusal is
    made here) was skipped silently: it is now an RM000 finding naming it, so lint fails."""
    (tmp_path / "m.py").write_text("x = 1\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "hidden_hazard.py").write_text("import jax.numpy as jnp\nx = jnp.empty(3)\n")
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    report = rc.lint.lint_paths([tmp_path])
    assert [Path(f).name for f in report.files] == ["m.py"]
    (f,) = report.findings
    assert (f.rule, f.path) == ("RM000", str(locked))
    assert "cannot read this directory (Permission denied)" in f.message and "read access" in f.fix


# -- remat_common.tune / capacity: checked before anything is built or compiled --------------------
def _never_built(plan: Any) -> Any:
    raise AssertionError("the target was built: the arguments were not checked first")


@pytest.mark.compat
@pytest.mark.parametrize("kwargs, match", [
    ({"choices": "recompute"}, r"choices must be a list of choice names .*got str 'recompute'\. "
                               r"Fix: pass \['recompute'\]"),  # it was split into characters
    ({"choices": 3}, r"choices must be a list"),
    ({"choices": [3]}, r"choice names must be strings"),
    ({"choices": {"mine": "bogus"}}, r"choice 'mine': unknown remat annotation 'bogus'"),  # was dropped
    ({"choices": {"mine": {"save": []}}}, r"choice 'mine': .*names no activations"),
    ({"plans": "minimal.yaml"}, r"plans must be a mapping \{name: plan\}.*got str"),
    ({"plans": ["x"]}, r"plans must be a mapping"),
    ({"plans": {"a": 3}}, r"tune: plans\['a'\]: Plan.coerce: cannot make a plan from int 3"),
    ({"max_compiles": "40"}, r"max_compiles must be an integer >= 1, got str '40'"),
    ({"max_compiles": 2.5}, r"max_compiles must be an integer >= 1, got float"),
    ({"max_compiles": True}, r"max_compiles must be an integer >= 1, got bool"),
    ({"time_limit": "10"}, r"time_limit must be a positive number of seconds"),
    ({"time_limit": -1}, r"time_limit must be a positive number"),  # stopped after one compile
    ({"time_limit": float("nan")}, r"time_limit must be a positive number"),
    ({"measure": "3"}, r"measure must be an integer >= 0, got str"),
    ({"measure": 2.5}, r"measure must be an integer >= 0"),
    ({"measure_steps": 0}, r"measure_steps must be an integer >= 1"),
    ({"objective": "memory"}, r"objective must be one of \['flops', 'time'\], got 'memory'"),
    ({"progress": 3}, r"progress must be a callable"),
    ({"cache": []}, r"cache must be a dict"),
    ({"layers": 3}, r"layers must be the stack's path"),
])
def test_tune_arguments_are_checked_first(kwargs, match):
    with pytest.raises(RematError, match=match) as info:
        rc.tune(_never_built, "1GiB", **kwargs)
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.compat
def test_tune_target_must_be_a_builder():
    with pytest.raises(RematError, match=r"tune: target must be a builder build\(plan\)"):
        rc.tune(3, "1GiB")


@pytest.mark.compat
@pytest.mark.parametrize("kwargs, match", [
    ({"start": "8"}, r"capacity: start must be an integer >= 1, got str '8'"),
    ({"start": 0}, r"start must be an integer >= 1"),
    ({"start": True}, r"start must be an integer >= 1, got bool"),
    ({"start": 4, "step": "1"}, r"step must be an integer >= 1"),
    ({"start": 4, "step": 3}, r"start=4 must be a positive multiple of step=3"),
    ({"start": 4, "limit": 2}, r"limit=2 is below start=4: the search would report start"),
    ({"start": 4, "limit": -1}, r"limit must be an integer >= 1"),
    ({"start": 4, "max_compiles": 0}, r"max_compiles must be an integer >= 1"),
    ({"start": 4, "plans": "x.yaml"}, r"plans must be a mapping"),
    ({"start": 4, "plans": {"ok": None, "bad": 3}}, r"capacity: plans\['bad'\]: Plan.coerce"),
    ({"start": 4, "progress": "x"}, r"progress must be a callable"),
])
def test_capacity_arguments_are_checked_first(kwargs, match):
    kwargs = {"plans": {"r": {"layers.*": "recompute"}}, **kwargs}
    with pytest.raises(RematError, match=match):
        rc.measurement.capacity(lambda v: _never_built, "1GiB", **kwargs)


@pytest.mark.compat
@pytest.mark.parametrize("text, match", [
    ("flops_per_s: true\nhbm_bytes: 80GB\nhost_link_bytes_per_s: 6.4e10\n",
     r"flops_per_s True: it must be a positive, finite number"),  # was 1 FLOP/s
    ("flops_per_s: .nan\nhbm_bytes: 80GB\nhost_link_bytes_per_s: 6.4e10\n", r"flops_per_s nan"),
    ("flops_per_s: .inf\nhbm_bytes: 80GB\nhost_link_bytes_per_s: 6.4e10\n", r"flops_per_s inf"),
    ("base: h100\nhost_link_bytes_per_s: 64GB/s\n", r"host_link_bytes_per_s '64GB/s': units are not "
                                                    r"read"),
    ("base: h100\nhbm_bytes: 80XB\n", r"gpu\.yaml: hbm_bytes '80XB': unknown unit 'XB'"),
    ("base: [h100]\n", r"base \['h100'\] is not a built-in profile"),  # was TypeError: unhashable
    ("base: h100\nname: [a, b]\n", r"name must be a string, got list"),
])
def test_device_profiles_with_bad_fields(tmp_path, text, match):
    path = tmp_path / "gpu.yaml"
    path.write_text(text)
    with pytest.raises(PlanError, match=match):
        rc.tune(_never_built, "1GiB", profile=str(path))
    with pytest.raises(PlanError, match=r"device profile '.*missing\.yaml' does not exist"):
        rc.tune(_never_built, "1GiB", profile=str(tmp_path / "missing.yaml"))


# -- round 2 (issue 27): the unclear cases, now a clear message or correct behaviour ---------------

@pytest.mark.compat
@pytest.mark.parametrize("call, match", [
    (lambda: rc.checkpoint(3), r"checkpoint: fun must be a function \(or, to decorate, the "
                               r"annotation\); got int 3\. Fix: checkpoint\(fn, 'recompute'\)"),
    (lambda: rc.checkpoint(3, "recompute"), r"fun must be a function .*got int 3"),
    (lambda: rc.checkpoint(lambda x, n: x, static_argnums="2"),
     r"static_argnums must be an int or a sequence of ints; got str '2'\. Fix: static_argnums=2"),
    (lambda: rc.checkpoint(lambda x, n: x, static_argnums=True), r"static_argnums must be .*bool True"),
    (lambda: rc.checkpoint(lambda x, n: x, "offload", offload_argnums=["0"]),
     r"offload_argnums must be an int or a sequence of ints"),
    (lambda: rc.checkpoint("recompute")(3),  # was a function that failed only when called
     r"checkpoint: the decorated object must be a function; got int 3\. Fix: put "
     r"@checkpoint\('recompute'\) above a def"),
    (lambda: rc.checkpoint({"save": ["h"]})("not a function"), r"decorated object must be a function"),
])
def test_checkpoint_of_a_non_callable_or_string_argnums(call, match):
    with pytest.raises(TypeError, match=match):  # static_argnums='2' was accepted
        call()


@pytest.mark.compat
def test_checkpoint_argnums_fix_works():
    import jax
    import jax.numpy as jnp

    f = rc.checkpoint(lambda x, n: jnp.sum(jnp.sin(x) * n), static_argnums=1)
    assert float(jax.grad(f)(jnp.zeros(2), 3)[0]) == 3.0


@pytest.mark.compat
def test_a_plan_path_that_is_a_directory_or_a_link_loop_says_so(tmp_path):
    """Both were 'unknown format' (a name without a suffix) or 'does not exist' (a loop)."""
    (tmp_path / "plans").mkdir()
    with pytest.raises(PlanError, match=r"plan file '.*plans' is a directory\. Fix: give the path of "
                       r"a file inside it"):
        Plan.load(tmp_path / "plans")
    for a, b in (("loop", "loop2"), ("loop.yaml", "loop2.yaml")):
        (tmp_path / a).symlink_to(tmp_path / b)
        (tmp_path / b).symlink_to(tmp_path / a)
        with pytest.raises(PlanError, match=r"is a symbolic link loop\. Fix: point at a readable file"):
            Plan.load(tmp_path / a)


@pytest.mark.tooling  # a fresh interpreter that asks JAX for a TPU
def test_doctor_when_jax_cannot_start_its_backend():
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "tpu"}
    done = subprocess.run([sys.executable, "-m", "remat_common", "doctor"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr  # was a traceback
    assert "remat doctor: FAILED: JAX cannot start a backend" in done.stderr
    assert "JAX_PLATFORMS=tpu" in done.stderr and "fix: unset JAX_PLATFORMS" in done.stderr
    env.pop("JAX_PLATFORMS")
    env["JAX_PLATFORMS"] = "cpu"  # the fix
    done = subprocess.run([sys.executable, "-m", "remat_common", "doctor"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert "Backend" in done.stdout and "cpu" in done.stdout


@pytest.mark.tooling  # fresh interpreters, each failing as JAX is imported
def test_remat_with_a_jax_flag_jax_cannot_read(monkeypatch):
    """JAX_ENABLE_X64=maybe (or =2) made `import remat_common` raise ValueError('invalid truth
    value') with a traceback, `remat doctor` included."""
    import subprocess
    import sys

    import _remat_cli

    import tomllib

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["remat"] == "_remat_cli:main"  # the `remat` command is this guarded entry
    for value, argv, code, want in (
        ("maybe", ["doctor"], 1, "remat doctor: FAILED: JAX cannot start: the environment variable "
         "JAX_ENABLE_X64='maybe' is not a truth value; JAX accepts 1, 0, true, false, yes, no, on, "
         "off, y, n, t, f (any case).\n  fix: JAX_ENABLE_X64=1 or JAX_ENABLE_X64=0, or unset "
         "JAX_ENABLE_X64\n"),
        ("2", ["report", "r.yaml"], 2, "remat report: error: JAX cannot start: the environment "
         "variable JAX_ENABLE_X64='2' is not a truth value; JAX accepts 1, 0, true, false, yes, no, "
         "on, off, y, n, t, f (any case). Fix: JAX_ENABLE_X64=1 or JAX_ENABLE_X64=0, or unset "
         "JAX_ENABLE_X64.\n"),
    ):
        done = subprocess.run([sys.executable, "-m", "_remat_cli", *argv], capture_output=True,
                              text=True, cwd=root, env={**os.environ, "JAX_ENABLE_X64": value},
                              timeout=300)
        assert (done.returncode, done.stdout, done.stderr) == (code, "", want)
    from jax._src.config import bool_env  # the values named are the ones JAX reads: the fix works

    for value in (*_remat_cli.TRUTH_VALUES, *(v.upper() for v in _remat_cli.TRUTH_VALUES)):
        monkeypatch.setenv("JAX_REMAT_PLAN_PROBE", value)
        assert bool_env("JAX_REMAT_PLAN_PROBE", False) is (value.lower() in ("1", "true", "yes", "on", "y", "t"))


_SIGINT_DEFAULT_THEN_EXEC = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)  # as from a terminal (a background pytest ignores it)\n"
    "os.execv(sys.executable, [sys.executable, '-m', '_remat_cli', *sys.argv[1:]])\n")


@pytest.mark.tooling  # fresh interpreters interrupted while they import JAX
@pytest.mark.parametrize("command, delays", [("report", (0.3, 0.8, 1.5)), ("tune", (0.6,))])
def test_ctrl_c_while_remat_starts_is_one_line(command, delays):
    """A Ctrl-C in the first second or two (while JAX is imported) printed a KeyboardInterrupt
    traceback, once an ImportError of a half-imported jaxlib, or aborted in nanobind; later it
    printed "interrupted". Now every moment ends in that one line, status 130."""
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    argv = [command, "tests/data/report.yaml", "--no-progress"]
    if command == "tune":
        argv += ["--budget", "1GiB"]
    for delay in delays:
        proc = subprocess.Popen([sys.executable, "-c", _SIGINT_DEFAULT_THEN_EXEC, *argv], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        lines = err.splitlines()
        assert proc.returncode == 130 and out == "", (delay, err)
        assert lines[-1] == f"remat {command}: interrupted", (delay, err)
        assert all(line.startswith(f"remat {command}: ") for line in lines), (delay, err)  # heartbeats


def test_jax_vmap_over_an_annotated_nnx_module_names_the_fix():
    pytest.importorskip("flax")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import flax_remat_plugin as frp

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.block = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return jnp.tanh(self.block(x))

    model = frp.annotate(Net(nnx.Rngs(0)), {"block": "recompute"})
    xs = jnp.ones((3, 4))
    with pytest.raises(RematError, match=r"module 'block': its remat boundary \(nnx.remat\) writes the "
                       r"module's variables back(.|\n)*Fix: use the NNX transform,\nnnx.vmap") as info:
        jax.vmap(lambda x: model(x))(xs)  # was Flax's bare TraceContextError
    assert type(info.value.__cause__).__name__ == "TraceContextError"  # kept, not swallowed
    fresh = frp.annotate(Net(nnx.Rngs(0)), {"block": "recompute"})
    want = jax.vmap(Net(nnx.Rngs(0)))(xs)  # the plain model runs under jax.vmap
    got = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(fresh, xs)  # the first fix
    graphdef, state = nnx.split(fresh)  # the second
    got2 = jax.vmap(lambda s, x: nnx.merge(graphdef, s, copy=True)(x), in_axes=(None, 0))(state, xs)
    assert jnp.allclose(got, want) and jnp.allclose(got2, want)


def test_annotate_inside_nnx_jit_says_to_annotate_before():
    pytest.importorskip("flax")
    import jax.numpy as jnp
    from flax import nnx

    import flax_remat_plugin as frp

    @nnx.jit
    def step(m: nnx.Module, x: Any) -> Any:
        frp.annotate(m, {".": "recompute"})
        return m(x)

    with pytest.raises(PlanError, match=r"annotate: the model's variables are tracers: annotate runs "
                       r"inside a transform(.|\n)*Fix: annotate the model once, before the transform"):
        step(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), jnp.ones(2))  # was 'expected Linear, got Linear'
    model = frp.annotate(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), {".": "recompute"})  # the fix
    assert nnx.jit(lambda m, x: m(x))(model, jnp.ones(2)).shape == (2,)


@pytest.mark.tooling  # the example's training entry point (checked before anything is built)
def test_example_workdir_that_is_a_file(tmp_path):
    for needed in ("flax", "optax", "orbax.checkpoint"):  # the example's training code
        pytest.importorskip(needed)
    from examples import training
    from examples.nnx_gpt import train

    blocker = tmp_path / "run"
    blocker.write_text("")
    for workdir, match in ((blocker, r"--workdir .*run: it is a file, not a directory"),
                           (blocker / "sub", r"--workdir .*sub: .*run is a file, not a directory")):
        with pytest.raises(SystemExit, match=match + r"(.|\n)*Fix: give a directory path") as info:
            training.cli(train.main, ["--workdir", str(workdir), "--steps", "1", "--no-report"],
                         config=train.CONFIG)  # was mkdir's bare 'File exists'
        fix = re.search(r"--workdir (\S+)\.$", str(info.value)).group(1)
        assert not Path(fix).exists() and Path(fix).parent.is_dir() or fix.endswith("/sub")


# -- issue 39: hostile input, round 4 --------------------------------------------------------------
@pytest.mark.parametrize("kwargs, given, what", [
    (dict(policy="nothing_saveable", offload_argnums=(1,)), r"offload_argnums=\(1,\)",
     "policy=nothing_saveable"),
    (dict(annotation="recompute", offload_argnums=(1,)), r"offload_argnums=\(1,\)",
     "the annotation 'recompute'"),
    (dict(annotation="save", offload_argnames=("x",)), r"offload_argnames=\('x',\)",
     "the annotation 'save'"),
])
def test_offload_arguments_that_an_annotation_would_ignore_are_refused(kwargs, given, what):
    import jax
    if kwargs.get("policy"):
        kwargs = {**kwargs, "policy": getattr(jax.checkpoint_policies, kwargs["policy"])}

    def layer(w, x):
        return (x @ w).sum()
    with pytest.raises(PlanError, match=rf"^remat_common\.checkpoint: {given} .*{re.escape(what)} "
                                        r"offloads no argument.*Fix: checkpoint\(fn, 'offload'"):
        rc.checkpoint(layer, **kwargs)
    rc.checkpoint(layer, "offload", offload_argnums=(1,))  # the fix works


@pytest.mark.parametrize("mesh, kind", [({"data": 4.5}, "float"), ({"data": 4.0}, "float"),
                                        ({"data": True}, "bool"), ({"data": None}, "NoneType")])
def test_parse_mesh_refuses_what_is_not_an_integer(mesh, kind):
    from remat_common.measurement import parse_mesh
    with pytest.raises(RematError, match=rf"^--mesh .*of 'data' is a {kind}, not an integer"):
        parse_mesh(mesh, 4)
    assert parse_mesh({"data": 4}, 4) == parse_mesh("data=4", 4) == {"data": 4}


def test_clip_keeps_the_start_and_the_fix():
    from remat_common.internal import clip
    text = "CausalSelfAttention: d_model=130 is not divisible by n_heads=4: " + "x " * 300 + \
        "the rest. Fix: choose heads that do."
    out = clip(text, 200)
    assert len(out) <= 200 and out.startswith("CausalSelfAttention: d_model=130 is not divisible")
    assert out.endswith("... Fix: choose heads that do.")


def _remat(*argv: str, cwd: Path | None = None, timeout: int = 300) -> tuple[int, str, str]:
    """``remat ARGV`` as a user runs it: a subprocess; its exit code, first line of stderr, and
    stdout."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "_remat_cli", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    lines = [ln for ln in done.stderr.splitlines() if not ln.startswith("remat report: ")
             or ln.startswith("remat report: error")]
    return done.returncode, (lines[0] if lines else ""), done.stdout


_TINY_TARGET = '''
import jax, jax.numpy as jnp
from remat_common.measurement import MeasureTarget
PRESETS = {"wide": {"d": 64, "layers": 2}}

def f(plan, *, batch=2, d=8, layers=1, preset=""):
    w = jnp.ones((layers, d, d))
    x = jnp.ones((batch, d))
    def loss(w, x):
        for i in range(layers):
            x = jnp.tanh(x @ w[i])
        return x.sum()
    def step(w, x):
        l, g = jax.value_and_grad(loss)(w, x)
        return w - 0.1 * g, l
    return MeasureTarget(loss, (w, x), step, (w, x), None)
'''


@pytest.mark.tooling  # a `remat` process, as a user runs it
@pytest.mark.compat
@needs_report
def test_cli_sizes_and_presets_compose_by_one_rule(tmp_path):
    """A preset sets every size it names, the rest from the config; a conflict on one command
    line is refused; the table and the JSON state the sizes measured (issue 39: the config's
    sizes overrode `--size preset=llama3-8b` without a word)."""
    (tmp_path / "t.py").write_text(_TINY_TARGET)
    cfg = tmp_path / "report.yaml"
    cfg.write_text("target: t.py:f\nmodel: {d: 16, layers: 1}\nbatch: 4\nplans: {none: null}\n")
    code, first, out = _remat("report", str(cfg), "--steps", "0", "--no-progress", "--size",
                              "preset=wide", "layers=2", "--json", str(tmp_path / "r.json"))
    assert code == 0, first
    assert "sizes measured: d=64 layers=2 batch=4" in " ".join(out.split())
    sizes = json.loads((tmp_path / "r.json").read_text())["sizes"]
    assert sizes == {"d": 64, "layers": 2, "batch": 4}
    code, first, _ = _remat("report", str(cfg), "--steps", "0", "--no-progress", "--size",
                            "preset=wide", "d=32")
    assert code == 2
    assert re.match(r"remat report: error: .*report\.yaml: --size d=32 and --size preset=wide "
                    r"disagree: the preset sets d=64\..*Fix: drop --size d=32", first), first
    code, first, _ = _remat("report", str(cfg), "--size", "preset=nope")
    assert code == 2 and re.match(r"remat report: error: .*--size preset='nope' is not a preset "
                                  r"of the target; presets: 'wide'\. Fix:", first), first
    code, first, _ = _remat("report", str(cfg), "--size", "d=8", "d=16")
    assert code == 2 and first == ("remat report: error: --size d=8 and --size d=16: one size "
                                   "given twice. Fix: give d once."), first


@pytest.mark.tooling  # a `remat` process, as a user runs it
@pytest.mark.compat
@needs_report
def test_cli_example_preset_conflict_is_refused_before_measuring():
    code, first, _ = _remat("report", "example:nnx_gpt", "--steps", "0", "--plans", "none",
                            "--size", "preset=llama3-8b", "abstract=true", "n_heads=16", "batch=1")
    assert code == 2
    assert re.match(r"remat report: error: .*--size n_heads=16 and --size preset=llama3-8b "
                    r"disagree: the preset sets n_heads=32\.", first), first


def test_compose_sizes_layers():
    from remat_common.internal import ConfigError, compose_sizes
    presets = {"p": {"a": 1, "b": 2}}
    assert compose_sizes({"a": 9, "c": 3}, {"preset": "p"}, presets, "c") == {"a": 1, "b": 2, "c": 3}
    assert compose_sizes({"preset": "p"}, {"a": 5}, presets, "c") == {"a": 5, "b": 2}
    assert compose_sizes({}, {"preset": "p", "a": 1}, presets, "c") == {"a": 1, "b": 2}
    with pytest.raises(ConfigError, match=r"model sets preset: p and a: 5, but the preset sets a=1"):
        compose_sizes({"preset": "p", "a": 5}, {}, presets, "c")
    assert compose_sizes({"a": 1}, {"preset": "q"}, None, "c") == {"a": 1, "preset": "q"}


def _report_json() -> dict[str, Any]:
    """A small report's JSON, built without compiling (the fields a measured one has)."""
    path = Path(__file__).parent / "data" / "target_offload_report.json"
    return json.loads(path.read_text())


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(baseline="nope"), r"^Report\.from_json: baseline is 'nope', but it must be "
                                          r"one of its plans 'none', 'offload', 'recompute'"),
    (lambda d: d["plans"][0].update(bytes_by_path="corrupt"),
     r"^Report\.from_json: plans\[0\]\.bytes_by_path is 'corrupt', which is not what the plan's "
     r"own figures give"),
    (lambda d: d.pop("plans"), r"^Report\.from_json: plans is missing \(remat-report/1 has"),
    (lambda d: d.update(format=999), r"^Report\.from_json: the report has format 999; this "
                                     r"version reads 'remat-report/1' only"),
    (lambda d: d.pop("format"), r"the report has no 'format'"),
    (lambda d: d["plans"][1]["memory"].update(temp_size_in_bytes=-1),
     r"plans\[1\]\.memory\.temp_size_in_bytes is -1, but it must be null or a non-negative "
     r"integer"),
    (lambda d: d["plans"][1]["memory"].update(temp_size_in_bytes=float("nan")),
     r"plans\[1\]\.memory\.temp_size_in_bytes is nan, but it must be null or a non-negative "
     r"integer"),
    (lambda d: d["plans"][1]["residuals"][0].update(nbytes=-1),
     r"plans\[1\]\.residuals\[0\]\.nbytes is -1, but it must be a non-negative number"),
    (lambda d: d["plans"][1].update(flops_counted=float("nan")),
     r"plans\[1\]\.flops_counted is nan, but it must be null or a non-negative number"),
    (lambda d: d["plans"][0].update(residuals="abc"), r"plans\[0\]\.residuals is 'abc'"),
    (lambda d: d["plans"][0]["timing"].pop("lower_s"), r"plans\[0\] \('none'\) cannot be read"),
    (lambda d: d["capabilities"].pop("backend"), r"capabilities cannot be read"),
    (lambda d: d["plans"].append(d["plans"][0]), r"one name per plan"),
    (lambda d: d["plans"][0]["breakdown"]["timeline"].update(peak=10 ** 6),
     r"plans\[0\]\.breakdown\.timeline\.peak is 1000000, but it must be a point of the timeline"),
    (lambda d: d["plans"][0]["breakdown"]["timeline"].update(bytes=[[1, 2, 3]]),
     r"plans\[0\]\.breakdown\.timeline is .*one series of bytes per kind"),
    (lambda d: d["plans"][0]["breakdown"]["rows"][0].update(kind="bogus"),
     r"plans\[0\]\.breakdown\.rows\[0\] is .*'bogus'.*with a kind of 'allocator slack'"),
    (lambda d: d["plans"][0]["residuals"][0].update(placement="moon"),
     r"plans\[0\]\.residuals\[0\]\.placement is 'moon', but it must be 'device' or 'host'"),
    (lambda d: d["accelerator"].update(memory_bytes="lots"), r"accelerator\.memory_bytes is 'lots'"),
    (lambda d: d["plans"][0].update(flop_ratio=0), r"plans\[0\]\.flop_ratio is 0, but it must "
                                                   r"be null or a positive number"),
    (lambda d: d["plans"][0]["memory"].update(temp_size_in_bytes=True),
     r"plans\[0\]\.memory\.temp_size_in_bytes is True, but it must be null or a non-negative"),
])
def test_report_from_json_names_the_bad_field(edit, match):
    from remat_common.measurement import Report, ReportFormatError
    data = _report_json()
    Report.from_json(data)  # the file as written reads back
    edit(data)
    with pytest.raises(ReportFormatError, match=match) as info:
        Report.from_json(data)
    assert "Fix: write the report again" in str(info.value) and len(str(info.value)) < MAX_MESSAGE


def test_report_load_of_a_file_that_is_not_json(tmp_path):
    from remat_common.measurement import Report, ReportFormatError
    (tmp_path / "r.json").write_text('{"format": "remat-report/1",\n "plans": [')
    with pytest.raises(ReportFormatError, match=r"r\.json:2: not JSON"):
        Report.load(tmp_path / "r.json")
    with pytest.raises(ReportFormatError, match=r"cannot read .*missing\.json"):
        Report.load(tmp_path / "missing.json")


@pytest.mark.tooling  # a `remat` process, as a user runs it
@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("size, shape", [
    ("seq_len=1000000000 d_model=64", r"\(1, 2, 1000000000, 1000000000\) f32"),  # was SIGABRT
    ("d_model=1000000000", r"\(.*1000000000.*\) f32"),  # was a raw XLA traceback
])
def test_cli_sizes_beyond_what_xla_can_plan_are_refused_before_compiling(size, shape):
    code, first, _ = _remat("report", "example:nnx_gpt", "--steps", "0", "--plans", "none",
                            "--no-progress", "--size", "abstract=true", "n_layers=1", "n_heads=2",
                            "batch=1", *size.split())
    assert code == 2, first
    assert re.match(rf"remat report: error: the program holds an array of shape {shape}", first), first
    assert first.endswith("Fix: a smaller size (remat report --size seq_len=N d_model=N vocab=N "
                          "batch=N).")


_ABORT = """
import os
from remat_common._tooling.targets._compilers import _captured_stderr
with _captured_stderr() as log:
    os.write(2, b"I0000 00:00:1764972601.1 42 tpu_initializer.cc:60] libtpu started\\nsaid\\n")
print(repr(log[0]), flush=True)
with _captured_stderr():
    os.write(2, b"F1205 heap_simulator.cc:1234] Check failed: size >= 0\\n")
    os.abort()
"""


def _without_runtime_warnings(stderr: str) -> list[str]:
    """``stderr``'s lines but the warnings JAX's TPU runtime prints at ``import jax`` on a TPU
    host (``jax/_src/cloud_tpu_init.py:90: UserWarning: Transparent hugepages ...``, then the
    warning's source line), which come before anything the process itself writes."""
    out: list[str] = []
    skip = False
    for line in stderr.splitlines():
        if re.match(r".*/jax/_src/\w+\.py:\d+: UserWarning: ", line):
            skip = True
        elif not (skip and line.startswith(" ")):
            skip = False
            out.append(line)
    return out


@pytest.mark.tooling  # a process that XLA aborts
def test_a_compiler_abort_says_what_xla_said_and_the_fix():
    """XLA aborts the process (`Check failed`): no `finally` runs, and the captured stderr was
    lost (issue 39: exit 134, nothing printed). The watcher prints it with the diagnosis."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ABORT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode in (-6, 134)
    assert done.stdout.strip() == repr("I0000 00:00:1764972601.1 42 tpu_initializer.cc:60] "
                                       "libtpu started\nsaid\n")  # the log keeps everything
    lines = _without_runtime_warnings(done.stderr)
    assert lines[0] == "said", lines  # libtpu's start-up line is not passed on
    assert re.match(r"remat: error: the XLA compiler aborted the process while compiling .*XLA "
                    r"said: F1205 heap_simulator\.cc:1234\] Check failed: size >= 0\. .*Fix: a "
                    r"smaller size", lines[1]), lines
    assert lines[2] == "F1205 heap_simulator.cc:1234] Check failed: size >= 0"


@pytest.mark.tooling  # a `remat` process, as a user runs it
@pytest.mark.compat
@needs_report
@pytest.mark.parametrize("example, size, match", [
    # unrolled: minutes and gigabytes (200 layers: 165 s, 2.7 GB); refused at once
    ("nnx_gpt", "n_layers=1000000 d_model=64 n_heads=2 seq_len=16 batch=2",
     r"ValueError: GPT: n_layers=1000000 in layout 'list' builds, traces and compiles each layer "
     r"on its own.*Fix: layout='scan' \(remat report --size layout=scan\)"),
    ("eqx_gpt", "n_layers=1000 d_model=64 n_heads=2 seq_len=16 batch=2",
     r"GPT: n_layers=1000 in layout 'list'.*Fix: layout='scan'"),
    # without abstract=true a preset allocated ~90 GiB on this machine before compiling
    ("nnx_gpt", "preset=llama3-8b abstract=false",
     r"GPT: these sizes hold about 89\.9 GiB of float32 parameters and AdamW state.*Fix: "
     r"abstract=true"),
    ("eqx_gpt", "preset=llama3-8b abstract=false", r"about 89\.9 GiB.*Fix: abstract=true"),
    # an Equinox model of size zero was told to fix "an in-place NNX step"
    ("eqx_gpt", "d_model=0", r"GPT: d_model=0 must be a positive integer\. Fix: --size d_model=N"),
    ("nnx_gpt", "seq_len=64.0", r"GPT: seq_len=64\.0 must be a positive integer"),
    # own round: `rope=maybe` was read as true, n_heads=0 a ZeroDivisionError
    ("nnx_gpt", "rope=maybe", r"GPT: rope='maybe' must be true or false\. Fix: --size rope=true"),
    ("eqx_gpt", "n_heads=0", r"GPT: n_heads=0 must be a positive integer"),
    ("eqx_gpt", "abstract=maybe", r"GPT: abstract='maybe' must be true or false"),
    ("nnx_gpt", "dtype=int8", r"GPT: dtype='int8' is not a compute dtype; allowed: 'bfloat16', "),
    # the model's own message was cut in the middle ('CausalSelfAttention: d_mode....')
    ("nnx_gpt", "d_model=130",
     r"CausalSelfAttention: d_model=130, n_heads=4, n_kv_heads=4: n_heads must divide d_model "
     r"and n_kv_heads must divide n_heads\. Fix: choose heads that do \(measure_target\(None, "),
])
def test_cli_example_sizes_the_model_refuses_at_once(example, size, match):
    if "abstract=" not in size:
        size += " abstract=true"
    code, first, _ = _remat("report", f"example:{example}", "--steps", "0", "--plans", "none",
                            "--no-progress", "--size", *size.split())
    assert code == 2, first
    assert first.startswith(f"remat report: error: ") and re.search(match, first), first
    assert first.endswith("shows the full traceback).")


def test_zero_size_inputs_name_the_size_not_an_nnx_step():
    import jax.numpy as jnp
    from remat_common.measurement import MeasureTarget, measure

    def build(plan):
        w, x = jnp.ones((0, 3)), jnp.ones((2, 0))
        loss = lambda w, x: (x @ w).sum()  # noqa: E731

        def step(w, x):
            return w, loss(w, x)
        return MeasureTarget(loss, (w, x), step, (w, x), None)
    with pytest.raises(RematError, match=r"plan 'none': the training step has no backward pass to "
                                         r"measure: 2 of its inputs hold no element \(shapes "
                                         r"\(0, 3\) float32, \(2, 0\) float32\).*Fix: sizes of at"):
        measure(build, {"none": None}, steps=0)


@pytest.mark.tooling  # a `remat` process, as a user runs it
@pytest.mark.compat
@needs_report
def test_cli_json_to_a_full_disk_names_the_option_and_the_reason(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    code, first, out = _remat("report", "example:nnx_gpt", "--steps", "0", "--plans", "none",
                              "--no-progress", "--size", "n_layers=1", "d_model=32", "seq_len=16",
                              "batch=1", "--json", "/dev/full")
    assert code == 2 and "remat plans" in out  # the measurements were printed
    assert first == ("remat report: error: --json '/dev/full' could not be written: No space left "
                     "on device. The measurements are printed above. Fix: free space, or give "
                     "another path to --json.")


@pytest.mark.tooling  # a `remat` process, as a user runs it
@pytest.mark.compat
@needs_report
def test_cli_tune_reserve_beside_budget_is_refused():
    code, first, _ = _remat("tune", "example:nnx_gpt", "--budget", "1GiB", "--reserve", "0.1")
    assert code == 2
    assert first.startswith("remat tune: error: remat tune: --reserve 0.1 and --budget 1.00 GiB: "
                            "the reserve is what the default budget"), first


@pytest.mark.tooling  # a `remat` process, as a user runs it
@pytest.mark.compat
@needs_report
def test_a_configs_accelerator_file_is_read_next_to_the_config(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "t.py").write_text("def f(plan):\n    pass\n")
    (sub / "report.yaml").write_text("target: t.py:f\nplans: {a: null}\naccelerator: mine.txtpb\n")
    code, first, _ = _remat("report", str(sub / "report.yaml"), "--no-progress", cwd=tmp_path)
    assert code == 2
    assert first.startswith("remat report: error: accelerator ") and first.endswith(
        f": the target-config file '{sub / 'mine.txtpb'}' does not exist."), first


def test_a_breakdown_takes_the_compilers_peak_with_the_difference_as_a_row():
    """Compiled for v5e:2x2 the breakdown's rows summed to 166.5 KiB where memory_analysis()
    (what XLA accepts or refuses a program by) gave 293 KiB: one peak now, the difference a row."""
    from remat_common.measurement import MemoryBreakdown, PeakRow, Timeline
    b = MemoryBreakdown((PeakRow("parameter", None, "w", 100), PeakRow("allocator slack", None,
                                                                         None, 20)),
                        Timeline((), (), None, 0))
    assert b.reconciled(None) == b and b.reconciled(120) == b
    more = b.reconciled(300)
    assert more.total == 300 and more.rows[-1].kind == "compiler accounting"
    assert more.rows[-1].bytes == 180 and "memory_analysis()" in more.rows[-1].note
    assert more.reconciled(300) == more  # once
    less = b.reconciled(90)
    assert less.total == 90 and less.rows[-1].bytes == -30
    fit = more.will_it_fit(1000)
    assert sum(v for _, v in fit.parts) == 300


@pytest.mark.parametrize("text, kept", [
    ("Failed to find host bounds for accelerator type: WARNING: could not determine TPU "
     "accelerator type, please set env var `TPU_ACCELERATOR_TYPE` manually\n"
     "WARNING: Logging before InitGoogle() is written to STDERR\n"
     "E0000 00:00:1796509291.580208   19473 common_lib.cc:835] INVALID_ARGUMENT: Error: unexpected "
     "worker hostname 'WARNING: could not determine TPU worker hostnames' from env var "
     "TPU_WORKER_HOSTNAMES.\n=== Source Location Trace: === \n"
     "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:370\n", ""),
    ("E0000 00:00:1.2 7 tpu_compiler.cc:9] RESOURCE_EXHAUSTED: out of memory\n",
     "E0000 00:00:1.2 7 tpu_compiler.cc:9] RESOURCE_EXHAUSTED: out of memory\n"),
    ("F1205 heap_simulator.cc:1] Check failed: x\n", "F1205 heap_simulator.cc:1] Check failed: x\n"),
])
def test_libtpu_start_up_lines_are_left_out_and_real_errors_kept(text, kept):
    """Every XLA:TPU target run's stderr opened with libtpu lines that read as failures (captured
    on this machine from .venv-target's libtpu, off a TPU VM)."""
    from remat_common.internal import quiet_stderr
    assert quiet_stderr(text) == kept


def test_report_json_takes_a_negative_compiler_accounting_row():
    import dataclasses
    from remat_common.measurement import Report
    rep = Report.from_json(_report_json())
    p = rep.plans[0]
    less = dataclasses.replace(p, breakdown=p.breakdown.reconciled(p.breakdown.total - 5))
    rep = dataclasses.replace(rep, plans=(less, *rep.plans[1:]))
    assert less.breakdown.rows[-1].bytes == -5
    assert Report.from_json(json.loads(json.dumps(rep.to_json()))) == rep


def _tpu_compiler_missing() -> str | None:
    from remat_common.measurement import compiler_available
    return compiler_available("tpu")


@pytest.mark.target
@needs_report
@pytest.mark.skipif(_tpu_compiler_missing() is not None, reason="no XLA:TPU compiler here "
                    "(./scripts/test's target stage)")
def test_cli_v5e_one_peak_and_a_clean_stderr(tmp_path):
    """Compiled for v5e:2x2: the table's peak/device, the breakdown's peak and the JSON agree
    with memory_analysis(); libtpu's start-up lines are not in a clean run's stderr."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "_remat_cli", "report", "example:nnx_gpt", "--steps", "0",
         "--plans", "none", "--accelerator", "v5e:2x2", "--no-progress", "--json",
         str(tmp_path / "r.json"), "--size", "n_layers=1", "d_model=32", "seq_len=16", "batch=4",
         "vocab=64"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "400"})  # no line of ours wrapped (a long tmp path)
    assert done.returncode == 0, done.stderr
    assert all(ln.startswith(("remat report: ", "wrote ")) for ln in done.stderr.splitlines()), \
        done.stderr
    from remat_common.measurement import Report
    p = Report.load(tmp_path / "r.json")["none"]
    assert p.breakdown is not None and p.breakdown.total == p.memory.device_total
    assert sum(r.bytes for r in p.breakdown.rows) == p.memory.device_total
    assert p.breakdown.rows[-1].kind == "compiler accounting"  # what the buffer assignment missed


@pytest.mark.parametrize("kwargs, match", [
    (dict(offload_argnums=(5,)), r"offload_argnums=\(5,\): .* takes 2 positional argument\(s\) "
                                 r"\(w, x\), so \[5\] name\(s\) none.*Fix: positions from 0 to 1"),
    (dict(offload_argnames=("nope",)), r"offload_argnames=\('nope',\): .* has no argument\(s\) "
                                       r"\['nope'\]; its arguments: \['w', 'x'\]"),
    (dict(offload_argnums=()), r"offload_argnums=\(\) / offload_argnames=\(\) offload no argument"),
])
def test_offload_arguments_that_name_no_argument_are_refused(kwargs, match):
    """Own round: an out-of-range position, an unknown name or an empty tuple offloaded nothing,
    silently."""
    def layer(w, x):
        return (x @ w).sum()
    with pytest.raises(PlanError, match=match):
        rc.checkpoint(layer, "offload", **kwargs)
    rc.checkpoint(layer, "offload", offload_argnums=(-1,))  # the last one: a position it has
