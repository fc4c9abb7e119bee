"""remat_common: declarative, verified rematerialization plans for JAX.

The framework-neutral core: the annotation vocabulary, plans and their resolution along module
paths, a compiler into policies the installed JAX honours, a capability probe and a verifier.
"""

from ._annotation import Annotation as Annotation
from ._annotation import parse_annotation as parse_annotation
from ._capabilities import Capabilities as Capabilities
from ._capabilities import capabilities as capabilities
from ._checkpoint import CheckpointImpl as CheckpointImpl
from ._checkpoint import OffloadArgumentsWarning as OffloadArgumentsWarning
from ._checkpoint import call_module as call_module
from ._checkpoint import checkpoint as checkpoint
from ._checkpoint import compile_annotation as compile_annotation
from ._checkpoint import tag_inputs as tag_inputs
from ._checkpoint import wrap_call as wrap_call
from ._compile import EMITTED_POLICIES as EMITTED_POLICIES
from ._compile import CompiledBoundary as CompiledBoundary
from ._compile import CompiledPlan as CompiledPlan
from ._compile import compile_boundary as compile_boundary
from ._compile import compile_plan as compile_plan
from ._custom import Ambient as Ambient
from ._custom import CustomRuleWarning as CustomRuleWarning
from ._custom import RuleRun as RuleRun
from ._custom import RuleSet as RuleSet
from ._custom import collect_rule_runs as collect_rule_runs
from ._custom import custom_impl as custom_impl
from ._custom import custom_path as custom_path
from ._doctor import manifest as manifest
from ._errors import AnnotationError as AnnotationError
from ._errors import CapabilityError as CapabilityError
from ._errors import PlanError as PlanError
from ._errors import RematError as RematError
from ._errors import VerificationError as VerificationError
from ._lint import LINT_RULES as LINT_RULES
from ._lint import Finding as Finding
from ._lint import LintReport as LintReport
from ._lint import LintRule as LintRule
from ._lint import lint_paths as lint_paths
from ._lint import lint_source as lint_source
from ._measure import FigureNote as FigureNote
from ._measure import MeasureEvent as MeasureEvent
from ._measure import MeasureTarget as MeasureTarget
from ._measure import MemoryFigures as MemoryFigures
from ._measure import PlacementCheck as PlacementCheck
from ._measure import PlanReport as PlanReport
from ._measure import Report as Report
from ._measure import StepTiming as StepTiming
from ._measure import measure as measure
from ._model import ModelView as ModelView
from ._model import coerce_plan as coerce_plan
from ._model import plan_model as plan_model
from ._plan import Plan as Plan
from ._plan import Rule as Rule
from ._plan import path_matches as path_matches
from ._resolve import BoundarySpec as BoundarySpec
from ._rules import attention as attention
from ._rules import attention_rules as attention_rules
from ._rules import gated_mlp as gated_mlp
from ._rules import gated_mlp_rules as gated_mlp_rules
from ._rules import layer_norm as layer_norm
from ._rules import layer_norm_rules as layer_norm_rules
from ._rules import rms_norm as rms_norm
from ._rules import rms_norm_rules as rms_norm_rules
from ._flops import Flops as Flops
from ._flops import count_flops as count_flops
from ._resolve import LayerGroup as LayerGroup
from ._resolve import Resolution as Resolution
from ._resolve import layer_groups as layer_groups
from ._resolve import UnmatchedPatternWarning as UnmatchedPatternWarning
from ._resolve import resolve as resolve
from ._scope import checkpoint_name as checkpoint_name
from ._scope import collect_tags as collect_tags
from ._scope import current_module_path as current_module_path
from ._scope import effective_path as effective_path
from ._scope import layer_scope as layer_scope
from ._scope import module_scope as module_scope
from ._scope import qualify as qualify
from ._targets import check_modules as check_modules
from ._targets import check_targets as check_targets
from ._verify import Residual as Residual
from ._verify import ResidualReport as ResidualReport
from ._verify import Verification as Verification
from ._verify import saved_residuals as saved_residuals
from ._verify import verify as verify
from ._profiles import DeviceProfile as DeviceProfile
from ._tune import CapacityRow as CapacityRow
from ._tune import TunePoint as TunePoint
from ._tune import TuneResult as TuneResult
from ._tune import capacity as capacity
from ._tune import parse_bytes as parse_bytes
from ._tune import tune as tune
from ._version import __version__ as __version__

__all__ = sorted([
    "Ambient", "CustomRuleWarning", "RuleRun", "RuleSet", "attention", "attention_rules",
    "collect_rule_runs", "custom_impl", "custom_path", "gated_mlp", "gated_mlp_rules",
    "layer_norm", "layer_norm_rules", "rms_norm", "rms_norm_rules",
    "Finding", "LINT_RULES", "LintReport", "LintRule", "lint_paths", "lint_source", "manifest",
    "Annotation", "AnnotationError", "BoundarySpec", "Capabilities", "CapabilityError",
    "CheckpointImpl", "OffloadArgumentsWarning", "LayerGroup", "call_module", "effective_path", "layer_groups", "layer_scope",
    "CompiledBoundary", "CompiledPlan", "ModelView", "coerce_plan", "plan_model", "EMITTED_POLICIES", "MeasureTarget", "Plan", "PlanError", "RematError",
    "FigureNote", "MeasureEvent", "MemoryFigures", "PlacementCheck", "PlanReport", "Report",
    "StepTiming", "measure", "Flops", "count_flops",
    "Residual", "ResidualReport", "Resolution", "Rule", "UnmatchedPatternWarning", "Verification",
    "VerificationError", "capabilities", "checkpoint", "checkpoint_name", "collect_tags",
    "compile_annotation", "compile_boundary", "compile_plan", "current_module_path",
    "module_scope", "parse_annotation", "path_matches", "qualify", "resolve", "saved_residuals",
    "check_modules", "check_targets", "tag_inputs", "verify", "wrap_call",
    "CapacityRow", "DeviceProfile", "TunePoint", "TuneResult", "capacity", "parse_bytes", "tune",
])
