"""Rule stage: cheap trajectory checks on every conversation."""

from . import builtin_text, builtin_tools  # noqa: F401  (registers the built-in rule types)
from .packs import Finding, RuleEngine, load_pack, max_severity
from .registry import SEVERITY_RANK, Evidence, Hit, RuleArgs, registered_rule_types, rule_type
from .view import ConversationView

__all__ = [
    "SEVERITY_RANK",
    "ConversationView",
    "Evidence",
    "Finding",
    "Hit",
    "RuleArgs",
    "RuleEngine",
    "load_pack",
    "max_severity",
    "registered_rule_types",
    "rule_type",
]
