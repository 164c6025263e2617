"""The stable public path `helpers.planner`: its home is `helpers.plan.planner` (see that module).

Users' code and older notebooks import `helpers.planner`; the project's own code imports the home.
Nothing in `helpers/` imports this module (tests/test_layers.py).
"""

from helpers.plan.planner import (
    DECISION_RULE,
    GB,
    REMEDIES,
    RULE_COROLLARY,
    RULE_REFINEMENTS,
    NoPlanError,
    Plan,
    decision_rule,
    recommend,
)

__all__ = [
    "DECISION_RULE", "GB", "REMEDIES", "RULE_COROLLARY", "RULE_REFINEMENTS", "NoPlanError", "Plan",
    "decision_rule", "recommend",
]
