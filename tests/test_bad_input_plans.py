"""Bad plan files and plan values never crash, hang or pass silently (issues 13 and 27).

The cases are generated: every wrong type at every position of a plan in every file format,
duplicate keys in every position, and files that are not plan files. Each case asserts the error
type and what the message says (the value, where it came from, what is allowed or the fix), or the
behaviour. No JAX compilation happens here. Patterns and resolve: tests/test_bad_input_patterns.py;
the core's functions and the adapters: tests/test_bad_input_api.py; the tooling:
tests/test_bad_input_tooling.py; the ``remat`` command: tests/test_bad_input_cli.py.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import remat_common as rc
from remat_common import AnnotationError, Plan, PlanError, RematError
from remat_common.internal import short

from bad_input import MAX_MESSAGE

pytestmark = pytest.mark.lock_only  # what is refused and the message: checked before JAX runs


# -- writing a config in each format ---------------------------------------------------------------
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


@pytest.mark.compat
def test_an_annotation_given_as_the_plan_says_so():
    with pytest.raises(PlanError, match=r"plan file 'recompute': unknown format ''.*'recompute' is "
                                        r"an annotation, not a plan: for the whole model write "
                                        r"\{'\.': 'recompute'\}"):
        Plan.coerce("recompute")  # annotate(model, "recompute")


# -- files that are not plan files -----------------------------------------------------------------
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
