"""Rule stage: cheap trajectory checks on every conversation."""

from vigil.rules import builtin_policy, builtin_text, builtin_tools  # noqa: F401  (registers the built-in rule types)
from vigil.rules.packs import Finding, RuleEngine, load_pack, load_packs, max_severity
from vigil.rules.registry import Evidence, Hit, RuleArgs, load_plugins, registered_rule_types, rule_type
from vigil.rules.view import ConversationView
from vigil.schema import SEVERITY_RANK

__all__ = [
    "SEVERITY_RANK",
    "ConversationView",
    "Evidence",
    "Finding",
    "Hit",
    "RuleArgs",
    "RuleEngine",
    "load_pack",
    "load_packs",
    "load_plugins",
    "max_severity",
    "registered_rule_types",
    "rule_type",
]
