"""`python -m fp8check.harness` (also `python -m fp8check`): the fp8check command line."""
import sys

from .cli import main

sys.exit(main())
