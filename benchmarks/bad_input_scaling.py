"""How the core scales on large and hostile inputs (issue 13): prints one line per figure.

1. ``resolve``: 10,000 module paths x 1,000 rules (literal, glob, range and ``**`` rules).
2. Plan files of about 10 MB in YAML, TOML and JSON: ``Plan.load`` time.
3. The pathological ``**`` pattern: ``**.**.**.**.**.x`` against 2,000 paths of depth <= 25,
   and eight ``**`` against a depth-30 path; matcher steps counted.
4. A YAML alias bomb ("billion laughs"): time to the error.
5. ``remat lint`` on a generated tree of 660 files, against the time to parse the same files.
6. ``annotate`` (Flax NNX and Equinox) on a model of 5,000 modules with 250 rules.

Run: ``python benchmarks/bad_input_scaling.py`` (about a minute; no JAX compilation).
"""

from __future__ import annotations

import ast
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

from remat_common import Plan, RematError, resolve
from remat_common.internal import PathIndex, compiled
from remat_common.lint import lint_paths


def _timed(fn):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def model_paths(layers: int) -> list[str]:
    subs = ["", ".attn", ".attn.q", ".attn.k", ".attn.v", ".mlp", ".mlp.fc1", ".mlp.fc2",
            ".norm1", ".norm2"]
    return ["layers", *(f"layers.{i}{s}" for i in range(layers) for s in subs)]


def resolve_figure() -> None:
    paths = model_paths(1000)  # 10,001 paths
    rules: dict[str, object] = {}
    for i in range(0, 1000, 2):
        rules[f"layers.{i}"] = "recompute"                        # 500 literal
    for i in range(0, 1000, 4):
        rules[f"layers.{i}.attn"] = {"save": ["attn_out"]}        # 250 literal, merged names
    for a in range(1, 1000, 10):
        rules[f"layers.[{a}-{a + 8}]"] = "offload" if a % 20 == 1 else "recompute"  # 100 ranges
    for k in range(100):
        rules[f"layers.*.mlp.fc{k}" if k > 2 else "layers.*.mlp.fc1"] = "inherit"  # 100 globs
    for k in range(50):
        rules[f"**.norm{k % 2 + 1}" + ("" if k < 2 else f".x{k}")] = "inherit"  # 50 '**'
    plan = Plan.from_mapping(rules, mode="lenient")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the globs that match nothing only warn (lenient)
        res, dt = _timed(lambda: resolve(plan, paths))
    idx = PathIndex(["", *paths])
    for r in plan.rules:
        idx.matching(r.pattern)
    print(f"resolve: {len(paths)} paths x {len(plan.rules)} rules: {dt:.2f} s "
          f"({len(res.boundaries)} boundaries; matcher steps {idx.steps}, "
          f"{idx.steps / (len(paths) * len(plan.rules)):.4f} per (rule, path) pair)")
    # rules that are not literal at the front, most matching nothing (lenient: warnings)
    hostile = {
        "'**.*xN'": [f"**.*x{i}" for i in range(1000)],
        "'layers.*.m*N'": [f"layers.*.m*{i}" for i in range(1000)],
        "'**.[N-N+5].mlp'": [f"**.[{i}-{i + 5}].mlp" for i in range(1000)],
        "'*.*.mlp.fcN*'": [f"*.*.mlp.fc{i}*" for i in range(1000)],
    }
    for name, pats in hostile.items():
        plan = Plan.from_mapping(dict.fromkeys(pats, "recompute"), mode="lenient")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, dt = _timed(lambda: resolve(plan, paths))
        print(f"resolve: {len(paths)} paths x 1000 rules {name}: {dt:.2f} s")


def plan_file_figures(tmp: Path, target: int = 10 * 2**20) -> None:
    n = target // 40
    pats = [f"blocks.{i // 8}.sub{i % 8}.mlp" for i in range(n)]
    yaml_text = "defaults: {mode: lenient}\nrules:\n" + "".join(f'  "{p}": recompute\n' for p in pats)
    toml_text = '[defaults]\nmode = "lenient"\n[rules]\n' + "".join(f'"{p}" = "recompute"\n' for p in pats)
    json_text = json.dumps({"defaults": {"mode": "lenient"},
                            "rules": {p: "recompute" for p in pats}}, indent=1)
    # the same rules as a list of {pattern, remat} items: more text and more values per rule
    m = target // 52
    listed = pats[:m]
    yaml_list = "rules:\n" + "".join(f'  - pattern: "{p}"\n    remat: recompute\n' for p in listed)
    toml_list = "".join(f'[[rules]]\npattern = "{p}"\nremat = "recompute"\n' for p in listed)
    json_list = json.dumps({"rules": [{"pattern": p, "remat": "recompute"} for p in listed]},
                           indent=1)
    for suffix, layout, text in ((".yaml", "mapping", yaml_text), (".toml", "mapping", toml_text),
                                 (".json", "mapping", json_text), (".yaml", "list", yaml_list),
                                 (".toml", "list", toml_list), (".json", "list", json_list)):
        path = tmp / f"big{suffix}"
        path.write_text(text)
        cpu = time.process_time()
        plan, dt = _timed(lambda: Plan.load(path))
        cpu = time.process_time() - cpu
        print(f"Plan.load {suffix[1:]:<4} {layout:<7} {len(text) / 2**20:5.1f} MB, "
              f"{len(plan.rules)} rules: {dt:.2f} s ({cpu:.2f} s CPU; last rule at "
              f"{plan.rules[-1].source.rsplit('/', 1)[-1]})")


def star_figures() -> None:
    pat = compiled("**.**.**.**.**.x")
    paths = [".".join(f"m{j}" for j in range(i % 25 + 1)) + ("" if i % 3 else ".x")
             for i in range(2000)]
    steps = 0

    def run() -> int:
        nonlocal steps
        hits = 0
        for p in paths:
            ok, s = pat.match_steps(p.split("."))
            hits += ok
            steps += s
        return hits

    hits, dt = _timed(run)
    print(f"'**.**.**.**.**.x' vs 2000 paths (depth <= 26): {dt * 1e3:.1f} ms, {hits} hits, "
          f"{steps} steps")
    eight = compiled(".".join(["**"] * 8 + ["y"]))
    (ok, s), dt = _timed(lambda: eight.match_steps(["a"] * 30))
    print(f"eight '**' vs a depth-30 path: {dt * 1e3:.2f} ms, match={ok}, {s} steps")
    deep = ".".join(["a"] * 1200)
    ok, dt = _timed(lambda: compiled(deep).matches(deep))
    print(f"1,200-segment pattern: {dt * 1e3:.2f} ms, match={ok} (no recursion)")


def alias_bomb_figure(tmp: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = tmp / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nrules:\n  x: *i\n")
    t = time.perf_counter()
    try:
        Plan.load(path)
        msg = "(loaded!)"
    except RematError as e:
        msg = str(e)
    print(f"YAML alias bomb ({path.stat().st_size} bytes, 9^9 leaves): "
          f"{time.perf_counter() - t:.3f} s to a {len(msg)}-character error")


_SOURCE = '''\
import jax
import jax.numpy as jnp
from functools import partial


def block_{i}(params, x):
    buf = jnp.empty(x.shape)
    buf = buf.at[...].set(x)
    y = jnp.tanh(x @ params["w"]) + buf
    return jax.checkpoint(lambda z: z * 2, prevent_cse=True)(y)


class Layer{i}:
    def __init__(self, d):
        self.d = d

    def __call__(self, x):
        h = x
{body}
        return h
'''


def lint_figure(tmp: Path, files: int = 660) -> None:
    root = tmp / "tree"
    body = "".join(f"        h = jnp.tanh(h * {k}.0 + {k})\n" for k in range(250))
    for i in range(files):
        d = root / f"pkg{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(_SOURCE.format(i=i, body=body))
    srcs = [p.read_text() for p in sorted(root.rglob("*.py"))]

    def parse_all() -> None:
        for s in srcs:
            ast.parse(s)  # each tree dropped at once, as lint does

    _, parse_s = _timed(parse_all)
    one, dt1 = _timed(lambda: lint_paths([root], jobs=1))
    report, dt = _timed(lambda: lint_paths([root]))  # default: one worker per core, up to 8
    assert report == one
    size = sum(map(len, srcs)) / 2**20
    print(f"remat lint: {len(report.files)} files ({size:.1f} MB): {dt:.2f} s with the default "
          f"workers ({os.cpu_count()} cores), {dt1:.2f} s in one process (ast.parse alone "
          f"{parse_s:.2f} s), {len(report.findings)} findings")


def annotate_figures(layers: int = 500) -> None:
    """Both adapters on 500 blocks of 9 leaf modules (about 5,000 modules), 250 rules."""
    import equinox as eqx
    import jax.numpy as jnp
    from flax import nnx

    import equinox_remat_plugin as erp
    import flax_remat_plugin as frp

    class Leaf(nnx.Module):
        def __init__(self) -> None:
            self.w = nnx.Param(jnp.ones((2,)))

        def __call__(self, x):  # type: ignore[no-untyped-def]
            return x * self.w

    class Block(nnx.Module):
        def __init__(self) -> None:
            self.subs = nnx.List([Leaf() for _ in range(9)])

        def __call__(self, x):  # type: ignore[no-untyped-def]
            for s in self.subs:
                x = s(x)
            return x

    class Model(nnx.Module):
        def __init__(self, n: int) -> None:
            self.layers = nnx.List([Block() for _ in range(n)])

    class EBlock(eqx.Module):
        subs: list

        def __init__(self) -> None:
            self.subs = [eqx.nn.Identity() for _ in range(9)]

        def __call__(self, x):  # type: ignore[no-untyped-def]
            return x

    class EModel(eqx.Module):
        layers: list

        def __init__(self, n: int) -> None:
            self.layers = [EBlock() for _ in range(n)]

    rules: dict[str, object] = {f"layers.{i}": "recompute" for i in range(0, layers, 4)}
    rules.update({f"layers.{i}.subs.[0-3]": {"save": ["h"]} for i in range(1, layers, 4)})
    nnx_model, eqx_model = Model(layers), EModel(layers)
    _, dt_nnx = _timed(lambda: frp.annotate(nnx_model, rules))
    _, dt_eqx = _timed(lambda: erp.annotate(eqx_model, rules))
    print(f"annotate, {len(frp.module_paths(nnx_model))} NNX modules x {len(rules)} rules: "
          f"{dt_nnx:.2f} s; {len(erp.module_paths(eqx_model))} Equinox modules: {dt_eqx:.2f} s")


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        resolve_figure()
        plan_file_figures(tmp)
        star_figures()
        alias_bomb_figure(tmp)
        lint_figure(tmp)
        annotate_figures()


if __name__ == "__main__":
    main()
