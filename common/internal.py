"""Internals exposed for this repository's tests and benchmarks. No stability guarantees.

Anything here may change or disappear in any release. Code outside this repository should use
``remat_common`` and its documented namespaces (``rules``, ``measurement``, ``lint``, ``adapter``,
``testing``).
"""

from . import _hazards as hazards
from . import _jaxcompat as jaxcompat
from ._custom import with_fallbacks as with_fallbacks
from ._errors import clip as clip
from ._errors import short as short
from ._jaxcompat import parse_version as parse_version
from ._pattern import PathIndex as PathIndex
from ._pattern import compiled as compiled
from ._pattern import parse_pattern as parse_pattern
from ._plan import MAX_PLAN_BYTES as MAX_PLAN_BYTES
from ._plan import presets as presets
from ._shipped import DOCS_URL as DOCS_URL
from ._shipped import doc_url as doc_url
from ._shipped import docs_dir as docs_dir
from ._shipped import examples_dir as examples_dir
from ._shipped import headings as headings
from ._shipped import pages as pages
from ._yaml import load_yaml as load_yaml
from ._compiler import compiler_identity as compiler_identity
from ._module_calls import scoped_module_calls as scoped_module_calls
from ._paths import module_of as module_of
from ._tooling.accelerators._hlo import program_remat as program_remat
from ._tooling.accelerators._compilers import quiet_stderr as quiet_stderr
from ._tooling.accelerators._meshes import target_mesh as target_mesh
from ._tooling.accelerators._units import parse_bytes as parse_bytes
from ._tooling.measurement._host_memory import beyond_machine as beyond_machine
from ._tooling.measurement._host_memory import host_budget as host_budget
from ._tooling.measurement._host_memory import over_memory as over_memory
from ._tooling.accelerators._profiles import PROFILES as PROFILES
from ._tooling.tune._search import below_save_all as below_save_all
from ._tooling.accelerators._accelerators import accelerator_for as accelerator_for
from ._tooling.report._compare import both_ways_table as both_ways_table
from ._tooling.report._compare import compare_reports as compare_reports
from ._tooling.report._render import layer_bytes as layer_bytes
from ._tooling.cli._main import main as main
from ._tooling.cli._config import ConfigError as ConfigError
from ._tooling.cli._config import compose_sizes as compose_sizes
from ._tooling.cli._config import ReportConfig as ReportConfig
from ._tooling.cli._config import load_function as load_function
from ._tooling.cli._config import parse_size as parse_size
from ._tooling.cli._report import run_report as run_report
from ._tooling.cli._report import with_target as with_target
from ._tooling.doctor._doctor import DISTRIBUTIONS as DISTRIBUTIONS
from ._tooling.doctor._doctor import FEATURES as FEATURES
from ._tooling.doctor._doctor import FLOORS as FLOORS
from ._tooling.doctor._doctor import JAX_RANGE as JAX_RANGE
from ._tooling.doctor._doctor import OPTIONAL as OPTIONAL
from ._tooling.doctor._doctor import diagnose as diagnose
from ._tooling.doctor._doctor import installed_versions as installed_versions
from ._tooling.measurement._layout import checked_stacks as checked_stacks
from ._tooling.measurement._layout import reference_plans as reference_plans
from ._tooling.lint._lint import python_files as python_files
from ._tooling.measurement._notes import cse_undid_remat as cse_undid_remat
from ._tooling.measurement._target import jittable as jittable
from ._tooling.measurement._measure import measure_parked as measure_parked
from ._tooling.measurement._measure import release_device_memory as release_device_memory
from ._tooling.measurement._notes import normalized_hlo as normalized_hlo
from ._tooling.measurement._step import FedSteps as FedSteps
from ._tooling.measurement._step import lower_step as lower_step
from ._tooling.accelerators._units import fmt_bytes as fmt_bytes
from ._tooling.report._plots import layers_path as layers_path
from ._tooling.report._render import notes_lines as notes_lines
from ._tooling.report._render import peak_rows as peak_rows
from ._tooling.report._render import stacked_label as stacked_label
from ._tooling.report._plots import tradeoff_figure as tradeoff_figure
from ._tooling.measurement._report import backend_notes as backend_notes
from ._tooling.cli._report import Heartbeat as Heartbeat
from ._tooling.cli._tune import points_table as points_table
from ._tooling.tune._capacity import NoFit as NoFit
from ._tooling.tune._model import assignment_plan as assignment_plan
from ._tooling.tune._model import custom_choice as custom_choice
from ._tooling.tune._runner import flops_countable as flops_countable
from ._tooling.tune._capacity import largest_fit as largest_fit
from ._tooling.tune._capacity import size_step as size_step
from ._tooling.checks import capacity_check as capacity_check
from ._tooling.checks import concrete_builds as concrete_builds
from ._tooling.checks import device_check as device_check
from ._tooling.checks import example_model as example_model
from ._tooling.checks import example_plan as example_plan
from ._tooling.checks import example_step as example_step
from ._tooling.checks import train_example as train_example


__all__ = [
    "ConfigError",
    "DISTRIBUTIONS",
    "DOCS_URL",
    "FEATURES",
    "FLOORS",
    "FedSteps",
    "Heartbeat",
    "JAX_RANGE",
    "MAX_PLAN_BYTES",
    "NoFit",
    "OPTIONAL",
    "PROFILES",
    "PathIndex",
    "ReportConfig",
    "accelerator_for",
    "assignment_plan",
    "backend_notes",
    "below_save_all",
    "beyond_machine",
    "both_ways_table",
    "capacity_check",
    "checked_stacks",
    "clip",
    "compare_reports",
    "compiled",
    "compiler_identity",
    "compose_sizes",
    "concrete_builds",
    "cse_undid_remat",
    "custom_choice",
    "device_check",
    "diagnose",
    "doc_url",
    "docs_dir",
    "example_model",
    "example_plan",
    "example_step",
    "examples_dir",
    "flops_countable",
    "fmt_bytes",
    "headings",
    "host_budget",
    "installed_versions",
    "jaxcompat",
    "jittable",
    "largest_fit",
    "layer_bytes",
    "layers_path",
    "load_function",
    "load_yaml",
    "lower_step",
    "main",
    "measure_parked",
    "normalized_hlo",
    "over_memory",
    "pages",
    "parse_bytes",
    "parse_pattern",
    "parse_size",
    "parse_version",
    "peak_rows",
    "points_table",
    "program_remat",
    "python_files",
    "quiet_stderr",
    "reference_plans",
    "release_device_memory",
    "run_report",
    "scoped_module_calls",
    "short",
    "size_step",
    "stacked_label",
    "target_mesh",
    "tradeoff_figure",
    "train_example",
    "with_fallbacks",
    "with_target",
]
