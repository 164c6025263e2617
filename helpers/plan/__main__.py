"""`python -m helpers.plan`: the planner's command line (`helpers.plan.cli.main`)."""

import sys

from helpers.plan.cli import main

if __name__ == "__main__":
    sys.exit(main())
