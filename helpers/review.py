"""The stable public path `helpers.review`: its home is `helpers.ledger.review` (see that module).

Users' code and older notebooks import `helpers.review`; the project's own code imports the home.
Nothing in `helpers/` imports this module (tests/test_layers.py).
"""

import sys

from helpers.ledger.review import (
    Ledger,
    Row,
    evidence_table,
    format_table,
    main,
    readme_block,
    run_check,
    run_ledger,
    to_markdown,
    write_readme,
)

__all__ = [
    "Ledger", "Row", "evidence_table", "format_table", "main", "readme_block", "run_check", "run_ledger",
    "to_markdown", "write_readme",
]

if __name__ == "__main__":
    sys.exit(main())
