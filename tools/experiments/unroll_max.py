"""tools/tpu-measure.py with forward.MAX_UNROLLED_CHUNKS set from $UNROLL_MAX (an experiment, not shipped)."""
import os
import runpy
import sys

sys.path.insert(0, os.getcwd())
from svg_lib.kernels import forward  # noqa: E402

forward.MAX_UNROLLED_CHUNKS = int(os.environ.get("UNROLL_MAX", "3"))
sys.exit(runpy.run_path("tools/tpu-measure.py", run_name="measure")["main"](sys.argv[1:]))
