"""The lint rules (:data:`LINT_RULES`: id, name, what each flags and why) and what a run of
``remat lint`` reports (:class:`Finding`, :class:`LintReport`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final


@dataclasses.dataclass(frozen=True)
class LintRule:
    """One lint rule: a stable id (``RM001``), a short name, what is wrong and the fix."""

    id: str
    name: str
    summary: str
    fix: str


_RULES: Final = (
    LintRule(
        "RM000", "syntax-error",
        "the file cannot be parsed, so it was not checked",
        "fix the syntax error (remat lint parses with the running Python's ast module).",
    ),
    LintRule(
        "RM001", "checkpoint-policies-import",
        "importing jax.checkpoint_policies as a module fails on the shipped wheels "
        "(ModuleNotFoundError: in JAX 0.11 it is an attribute of jax, not a module)",
        "`import jax` and use attribute access: jax.checkpoint_policies.SaveOnlyTheseNames(...), "
        "or bind cp = jax.checkpoint_policies.",
    ),
    LintRule(
        "RM002", "uninitialized-empty",
        "jax.numpy.empty/empty_like return uninitialised memory on GPU and TPU since JAX 0.11 "
        "(CPU still gives zeros, so CPU tests cannot catch a read before write)",
        "use jnp.zeros/jnp.zeros_like (or jnp.full) unless every element is provably written "
        "before it is read; then mark the line `# remat: ignore[RM002]`.",
    ),
    LintRule(
        "RM003", "remat3-changed-policy",
        "this policy is silently changed under jax_remat3 (0.11.0 saves nothing; 0.11.2 drops "
        "primitive-based parts), with no warning and correct gradients",
        "use one name-based policy (jax.checkpoint_policies.SaveOnlyTheseNames / "
        "SaveAndOffloadOnlyTheseNames over checkpoint_name tags, or dots_saveable alone), or a "
        "remat_common plan.",
    ),
    LintRule(
        "RM004", "save-anything-except-ignores-names",
        "save_anything_except_these_names ignores its argument in JAX 0.11 and 0.12: it saves "
        "everything, the named values included",
        "to save every named value except some, use jax.checkpoint_policies.SaveAnyNamesButThese("
        "frozenset({...})) (save_any_names_but_these(...) on 0.12); to recompute chosen values, "
        "list the ones to keep with SaveOnlyTheseNames or a plan's {save: [...]} annotation.",
    ),
    LintRule(
        "RM005", "custom-remat-without-checkpoint",
        "no enclosing checkpoint is visible for this jax.custom_remat function in this file; "
        "differentiating it outside a checkpoint raises an empty NotImplementedError",
        "call it inside jax.checkpoint / jax.remat / nnx.remat / eqx.filter_checkpoint / "
        "remat_common.checkpoint, or annotate its module 'custom' in a plan (its __remat_custom__ "
        "runs inside the boundary); if the checkpoint is in another file, mark the line "
        "`# remat: ignore[RM005]`.",
    ),
    LintRule(
        "RM006", "jit-inline-true",
        "jit(inline=True) changed meaning between JAX 0.11.0 (JAX_EARLY) and 0.11.2 (JAX_LATE)",
        "say which one you mean: inline=jax.Inline.JAX_EARLY (checkpoint_name tags inside stay "
        "visible by name) or inline=jax.Inline.JAX_LATE.",
    ),
    LintRule(
        "RM007", "prevent-cse-false",
        "prevent_cse=False is ignored by jax_remat3 on JAX 0.11.0 (a CSE barrier is still "
        "emitted); it is honoured on 0.11.2+ and with remat3 off",
        "require jax>=0.11.2 where the saving matters (`remat doctor` reports the version) and "
        "then mark the line `# remat: ignore[RM007]`, or drop the argument.",
    ),
)

#: Every rule by id, in id order.
LINT_RULES: Final[Mapping[str, LintRule]] = {r.id: r for r in _RULES}
BY_NAME: Final = {r.name: r.id for r in _RULES}


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One hazard found by :func:`lint_source` / :func:`lint_paths`.

    Attributes:
      path: the file, as it was given (or found under a given directory).
      line, col: 1-based position of the offending expression, import or keyword.
      rule: the rule id (``RM002``); see :data:`LINT_RULES`.
      name: the rule's short name (``uninitialized-empty``).
      message: what is wrong here and why.
      fix: what to do instead.
    """

    path: str
    line: int
    col: int
    rule: str
    name: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule} [{self.name}] {self.message}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LintReport:
    """What :func:`lint_paths` found.

    Attributes:
      findings: every unsuppressed finding, sorted by path, line and column.
      files: the Python files that were checked.
      suppressed: how many findings ``# remat: ignore`` comments silenced.
    """

    findings: tuple[Finding, ...]
    files: tuple[str, ...]
    suppressed: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def counts(self) -> dict[str, int]:
        """Findings per rule id, in id order."""
        c = Counter(f.rule for f in self.findings)
        return {rule: c[rule] for rule in sorted(c)}

    def summary(self) -> str:
        """One line: how many findings, per rule, in how many of how many files."""
        n_files = len(self.files)
        tail = f"{self.suppressed} suppressed" if self.suppressed else ""
        if not self.findings:
            return f"remat lint: no problems in {n_files} file(s)" + (f" ({tail})" if tail else "")
        per_rule = ", ".join(f"{rule}: {n}" for rule, n in self.counts.items())
        n_bad = len({f.path for f in self.findings})
        return (f"remat lint: {len(self.findings)} problem(s) in {n_bad} of {n_files} file(s) "
                f"({per_rule}" + (f"; {tail}" if tail else "") + ")")

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.findings],
            "summary": {
                "files": len(self.files), "findings": len(self.findings),
                "suppressed": self.suppressed, "by_rule": self.counts,
            },
            "files": list(self.files),
        }
