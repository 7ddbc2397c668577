"""`python -m harness`: the fp8check command line."""
import sys

from .cli import main

sys.exit(main())
