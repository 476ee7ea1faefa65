"""`python -m svg_lib ...`: the commands are in svg_lib/cli/."""
from svg_lib.cli import main

raise SystemExit(main())
