"""`python -m svg_lib ...`: see svg_lib/cli.py for the commands."""
from .cli import main

raise SystemExit(main())
