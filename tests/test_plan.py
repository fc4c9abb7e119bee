"""Plans: construction, files (YAML, TOML, JSON) with positions in errors, patterns, fingerprints."""

from pathlib import Path

import pytest

from remat_common import AnnotationError, Plan, PlanError, Rule, parse_annotation
from remat_common.adapter import path_matches

pytestmark = pytest.mark.lock_only  # plan files parsed: no JAX

DATA = Path(__file__).parent / "data"
EXPECTED = [
    ("layers.*", parse_annotation("recompute")),
    ("layers.[0-1]", parse_annotation("offload")),
    ("layers.*.attn", parse_annotation({"save": ["attn_out"]})),
]


@pytest.mark.compat
@pytest.mark.parametrize("name", ["plan_ok.yaml", "plan_ok.toml", "plan_ok.json"])
def test_load_all_formats_equal(name):
    plan = Plan.load(DATA / name)
    assert [(r.pattern, r.annotation) for r in plan.rules] == EXPECTED
    assert plan == Plan.from_mapping(dict(EXPECTED))  # source is not part of equality
    assert plan.fingerprint() == Plan.from_mapping(dict(EXPECTED)).fingerprint()
    assert plan.strict and not plan.nesting and plan.offload_dst == "pinned_host"


@pytest.mark.compat
def test_rule_sources_carry_file_and_line():
    yaml_plan = Plan.load(DATA / "plan_ok.yaml")
    assert [r.source.rsplit(":", 1)[1] for r in yaml_plan.rules] == ["6", "7", "8"]
    toml_plan = Plan.load(DATA / "plan_ok.toml")
    assert [r.source.rsplit(":", 1)[1] for r in toml_plan.rules] == ["6", "7", "8"]


@pytest.mark.compat
def test_config_round_trip_and_coerce(tmp_path):
    plan = Plan.from_mapping(dict(EXPECTED), offload_dst="unpinned_host", mode="lenient")
    assert not plan.strict and plan.offload_dst == "unpinned_host"
    assert Plan.from_config(plan.to_config()) == plan
    assert Plan.coerce(dict(EXPECTED)) == Plan.from_mapping(dict(EXPECTED))
    assert Plan.coerce(EXPECTED) == Plan.from_mapping(dict(EXPECTED))
    assert Plan.coerce(str(DATA / "plan_ok.yaml")) == Plan.load(DATA / "plan_ok.yaml")
    assert Plan.coerce(plan) is plan
    combined = Plan.from_mapping({"a": "save"}) + {"b": "recompute"}
    assert [r.pattern for r in combined.rules] == ["a", "b"]
    assert plan.fingerprint() != Plan.from_mapping(dict(EXPECTED)).fingerprint()
    assert hash(plan) == hash(Plan.from_config(plan.to_config()))


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.compat
@pytest.mark.parametrize(
    "name, text, match",
    [
        ("bad.yaml", "rules:\n  layers.*: recompute\n  layers.0: recomptue\n",
         r"module 'layers.0' \(.*bad.yaml:3\): unknown remat annotation 'recomptue'.*Allowed strings"),
        ("bad.yaml", "rules:\n  a: save\n  b: {save: [x], offload: [x]}\n",
         r"bad.yaml:3.*names 'x' are listed both"),
        ("bad.yaml", "rule:\n  a: save\n",
         r"top-level keys 'defaults', 'rules', 'state' and nothing else.*Found: 'rule'"),
        ("bad.yaml", "defaults: {mode: loose}\nrules: {a: save}\n",
         r"unknown mode 'loose'. Allowed: 'lenient', 'strict'"),
        ("bad.yaml", "defaults: {offload_to: host}\nrules: {a: save}\n",
         r"unknown default\(s\) 'offload_to'. Allowed: 'mode', 'nesting', 'offload_dst', 'offload_src'"),
        ("bad.yaml", "rules:\n  a: save\n  a: recompute\n", r"bad.yaml:3: pattern 'a' appears twice \(first at line 2\)"),
        ("bad.yaml", "rules:\n  '': save\n", r"empty or non-string path pattern ''.*Fix"),
        ("bad.yaml", "rules:\n  layers..0: save\n", r"bad.yaml:2: path pattern 'layers..0' has an empty segment"),
        ("bad.yaml", "rules: [a, b]\n", r"cannot read rule 'a'"),
        ("bad.yaml", "rules:\n  a: [save\n", r"bad.yaml:\d+: invalid YAML"),
        ("bad.toml", "[rules]\n\"a\" = \"sav\"\n", r"bad.toml:2\): unknown remat annotation 'sav'"),
        ("bad.toml", "[rules\n", r"invalid TOML"),
        ("bad.json", "{\"rules\": {\"a\": \"save\"},}", r"bad.json:1: invalid JSON"),
        ("bad.ini", "", r"unknown format '.ini'. Allowed: '.json', '.toml', '.yaml', '.yml'"),
    ],
)
def test_file_errors(tmp_path, name, text, match):
    with pytest.raises((PlanError, AnnotationError), match="(?s)" + match):
        Plan.load(_write(tmp_path, name, text))


@pytest.mark.compat
def test_missing_file_and_bad_coerce(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(tmp_path / "nope.yaml")
    with pytest.raises(PlanError, match=r"cannot make a plan from int 3.*Give a remat_common.Plan"):
        Plan.coerce(3)


@pytest.mark.compat
@pytest.mark.parametrize(
    "pattern, path, hit",
    [
        ("layers.*", "layers.3", True),
        ("layers.*", "layers.3.mlp", False),
        ("layers.*.mlp", "layers.3.mlp", True),
        ("layers.[0-3]", "layers.3", True),
        ("layers.[0-3]", "layers.4", False),
        ("layers.[2-11]", "layers.10", True),
        ("layers.[2-11]", "layers.1", False),
        ("layers.[2-11]", "layers.attn", False),
        ("**.attn", "layers.0.attn", True),
        ("**.attn", "attn", True),
        ("layers.**", "layers.0.attn.q", True),
        ("*", "embed", True),
        ("*", "", False),
        (".", "", True),
        (".", "embed", False),
        ("blocks.?", "blocks.7", True),
    ],
)
def test_patterns(pattern, path, hit):
    assert path_matches(pattern, path) is hit
    assert Rule(pattern, parse_annotation("save")).matches(path) is hit
