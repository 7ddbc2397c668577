"""`python -m fp8check`: the fp8check command line."""
import sys

from fp8check.harness.cli import main

sys.exit(main())
