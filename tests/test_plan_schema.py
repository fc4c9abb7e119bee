"""The JSON Schema of plan files (``remat_common/plan.schema.json``, ``Plan.json_schema()``): the
repository's plan files validate against it, it names what the loader accepts, and it refuses
what the loader refuses where a schema can tell (``fixtures/schema.py`` validates: jsonschema
where installed, else its own check of the keywords used)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

import remat_common as rc
from fixtures.schema import validate
from remat_common.adapter import MAPPING_KEYS
from remat_common.internal import load_yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = rc.Plan.json_schema()
#: Every plan file of the repository: the shipped presets, the examples' plans, the tests' plan
#: files.
PLAN_FILES = sorted(
    [*ROOT.glob("common/presets/**/*.yaml"), *ROOT.glob("examples/*/plans/**/*.yaml"),
     *ROOT.glob("tests/data/**/*plan*.*"), *ROOT.glob("tests/data/plans/*.yaml")])


def _parsed(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".toml":
        return tomllib.loads(text)
    if path.suffix == ".json":
        return json.loads(text)
    return load_yaml(text, str(path))[0]


pytestmark = [pytest.mark.compat, pytest.mark.lock_only]  # the schema and plan files: no JAX


def test_the_schema_is_package_data() -> None:
    """Shipped with the package (pyproject.toml's package-data), read through importlib."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "plan.schema.json" in data["remat_common"]
    assert SCHEMA == json.loads((ROOT / "common" / "plan.schema.json").read_text())
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", PLAN_FILES, ids=[str(p.relative_to(ROOT)) for p in PLAN_FILES])
def test_the_repositorys_plan_files_validate(path: Path) -> None:
    rc.Plan.load(path)  # a plan the loader accepts ...
    assert validate(_parsed(path), SCHEMA) == []  # ... the schema accepts


def test_the_schema_names_what_the_loader_accepts() -> None:
    """Its annotation strings are the vocabulary's; its mapping keys the loader's; every default
    and every form of a rule it describes loads."""
    defs = SCHEMA["$defs"]
    kinds = defs["kind"]["enum"]
    for k in kinds:
        rc.parse_annotation(k)
    with pytest.raises(rc.AnnotationError, match=r"Allowed strings: (.*)"):
        rc.parse_annotation("not-a-kind")
    try:
        rc.parse_annotation("not-a-kind")
    except rc.AnnotationError as e:
        allowed = str(e).split("Allowed strings: ")[1].split(";")[0]
    assert sorted(kinds) == sorted(s.strip(" '") for s in allowed.split(","))
    keys = set().union(*(f["properties"] for f in defs["annotation"]["anyOf"] if "properties" in f))
    assert keys == set(MAPPING_KEYS)
    forms = [{"rules": {"a": "recompute", "b": {"save": ["h"]}, "c": {"remat": "offload",
                                                                     "offload_dst": "unpinned_host"},
                        "d": {"nested": "sqrt"}, "e": {"offload": "h", "nested": 4}}},
             {"defaults": {"offload_src": "device", "offload_dst": "pinned_host", "mode": "lenient",
                           "nesting": True}, "rules": [{"pattern": "a", "remat": "dots"},
                                                       {"b": "save"}, ["c", "dots_no_batch"]]},
             {"defaults": None, "rules": {}}]
    for doc in forms:
        assert validate(doc, SCHEMA) == []
        rc.Plan.from_config(doc)
    assert set(SCHEMA["properties"]["defaults"]["properties"]) == {
        "offload_src", "offload_dst", "mode", "strict", "nesting"}
    rc.Plan.from_config({"defaults": {"strict": False}, "rules": {}})


@pytest.mark.parametrize("doc", [
    {"rule": {"a": "save"}},  # the top-level key misspelt
    {"rules": {"a": "sav"}},  # an unknown annotation
    {"rules": {"a": {"remat": "recompute", "save": ["h"]}}},  # remat mixed with names
    {"rules": {"a": {"remat": "recompute", "nested": 1}}},  # a block of one layer
    {"rules": {"a": {"save": [" h"]}}},  # a name with a space
    {"defaults": {"mode": "loose"}, "rules": {}},
    {"defaults": {"offload_dest": "pinned_host"}, "rules": {}},
    {"rules": [{"pattern": "a"}]},
], ids=["top-key", "annotation", "remat+save", "nested-1", "name-space", "mode", "default-key",
        "rule-without-remat"])
def test_what_the_loader_refuses_the_schema_refuses(doc: dict[str, Any]) -> None:
    with pytest.raises(rc.RematError):
        rc.Plan.from_config(doc)
    assert validate(doc, SCHEMA) != []
