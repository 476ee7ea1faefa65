"""The static profile of a whole training step's attention: `jax.grad` of one method, compiled once.

The cost model (`cost.training_model`) prices a training step from probe kernels, cycles per grid
step of each body kind. This module asks the compiler about the program itself: the gradient of
`method`'s attention for q, k and v (`compiler.compile_gradient`'s program: the forward with its
log-sum-exp, the backward's kernels, and XLA's own ops around them: the scale, D = rowsum(do * o),
casts), compiled for a compile-only chip in a child process with libtpu's static-profile dump on.
The compiler writes one profile per kernel and per XLA op; the step's cycles are their sum (the ops
of one program run one after another on one TensorCore).

    from svg_lib.instruments.tpu.step_profile import profile_gradient
    step = profile_gradient(config, "b3", "v6e")
    step.total, step.forward, step.backward, step.others
    python -m svg_lib cost --grad [--method b3]

What the profile can and cannot see (`probes`' module docstring says why): it reads every
scalar-prefetched (SMEM) value as 0. Dense attention takes its tiles from program ids, so its
profile simulates every tile it computes. B1, B2 and B3 read their schedules from SMEM, so their
profile simulates every grid step as entry 0, class EMPTY: an idle step on key tile 0. For them
the whole-step profile prices the grid, the per-row and per-head work (init, finish, the fused
backward's dq copy) and XLA's ops, and no tile body. `StepProfile.tiles_simulated` says which.

The profile's time and memory grow quickly with the grid: 2,048 tokens at 512 x 256, one head, take
seconds; B3 at 16,128 tokens, 1024 x 512, two heads, took 155 s and 13 GB on a 2-core CPU (libtpu
0.0.42.1), and dense at 10,080 tokens, 512 x 256, was killed for memory. Keep the problem small.

Evidence kind: *simulated by the TPU compiler's static profile* (compile-only, nothing run).
libtpu reads its flags once, when it starts: the child process is started with them set.
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from svg_lib.attention import b3_mask
from svg_lib.chips import check_target
from svg_lib.core.planner import plan_tiles
from svg_lib.environment import require_libtpu
from svg_lib.instruments.tpu.compiler import compile_gradient
from svg_lib.instruments.tpu.cost import EVIDENCE, training_model
from svg_lib.instruments.tpu.probes import versions
from svg_lib.methods import METHODS
from svg_lib.problem import BenchConfig
from svg_lib.progress import bar as progress_bar

_CYCLES = re.compile(r"estimated_cycles:\s*(\d+)")
_SUFFIX = "_static_llo_profile.textproto"
BACKWARD_KERNEL_NAMES = ("_attention_fused_bwd", "_attention_dq", "_attention_dkv")
FORWARD_KERNEL_NAMES = ("_block_sparse_attention", "_flash_attention")


def op_part(name: str) -> str:
    """Which part of the step an op of the profile is: "backward" (a backward kernel), "forward"
    (the forward's kernel), or "others" (XLA's ops: scale, D, casts, broadcasts)."""
    if any(k in name for k in BACKWARD_KERNEL_NAMES):
        return "backward"
    if any(k in name for k in FORWARD_KERNEL_NAMES):
        return "forward"
    return "others"


@dataclass
class StepProfile:
    """The static profile of one compiled `jax.grad` of `method`'s attention (module docstring).

    `ops`: {op name: estimated cycles}, one entry per profile the compiler wrote."""

    method: str
    target: str
    problem: dict
    heads: int
    backward: str | None          # the backward form asked for (None: as build_attention picks)
    ops: dict
    compile_s: float
    versions: dict = field(default_factory=dict)
    evidence: str = EVIDENCE

    def part(self, part: str) -> int:
        return sum(c for name, c in self.ops.items() if op_part(name) == part)

    @property
    def forward(self) -> int:
        return self.part("forward")

    @property
    def backward_cycles(self) -> int:
        return self.part("backward")

    @property
    def others(self) -> int:
        return self.part("others")

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def tiles_simulated(self) -> bool:
        """True where the profile simulates the tiles the method computes (dense: tiles from program
        ids); False for the planned methods, whose SMEM schedules the profile reads as all EMPTY."""
        return not METHODS[self.method].planned

    def to_json(self) -> dict:
        return {**asdict(self), "forward": self.forward, "backward_cycles": self.backward_cycles,
                "others": self.others, "total": self.total, "tiles_simulated": self.tiles_simulated}

    def table(self) -> str:
        lines = [f"whole training step's attention, {self.method} (jax.grad for q, k, v), {self.heads} head(s), on "
                 f"{self.target}; {self.evidence}; compiled in {self.compile_s:.0f} s",
                 f"  {'op':44} {'part':9} {'cycles':>13}"]
        for name, c in sorted(self.ops.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:44} {op_part(name):9} {c:13,}")
        lines.append(f"  {'total':44} {'':9} {self.total:13,}  (forward {self.forward:,}, backward "
                     f"{self.backward_cycles:,}, XLA ops {self.others:,})")
        if not self.tiles_simulated:
            lines.append(f"  ({self.method} reads its schedule from SMEM, which the static profile reads as 0: every "
                         f"grid step simulates as an idle one; no tile body is in these cycles)")
        return "\n".join(lines)


def _read_profiles(profile_dir: str) -> dict:
    ops = {}
    for path in sorted(glob.glob(os.path.join(profile_dir, "*" + _SUFFIX))):
        cycles = [int(c) for c in _CYCLES.findall(Path(path).read_text())]
        if cycles:
            ops[os.path.basename(path)[:-len(_SUFFIX)]] = max(cycles)
    return ops


def _child(request: dict) -> dict:
    """In the child process (dump flag set): compile the gradient, read every profile written."""
    config = BenchConfig.from_json(request["problem"])
    verdict = compile_gradient(config, request["method"], request["target"], heads=request["heads"],
                               backward=request["backward"])
    if not verdict["ok"]:
        return {"error": verdict["error"]}
    return {"ops": _read_profiles(request["profile_dir"]), "compile_s": verdict["compile_s"]}


def profile_gradient(config: BenchConfig, method: str = "b3", target: str = "v6e", *, heads: int | None = None,
                     backward: str | None = None, timeout: float = 3600, show: bool = True) -> StepProfile:
    """Compile `jax.grad` of `method`'s attention at `config`'s size for `target` with the static profile
    on, in a child process (libtpu reads its flags once, at start), and return its `StepProfile`.

    `heads` overrides the config's (every head runs the same kernels on its own slice, one after
    another). `backward`: "fused" or "split", as `build_attention` takes it. `show`: a progress bar
    (stderr) while the compiler runs. RuntimeError with the child's last lines where it fails
    (a compiler refusal, or libtpu's profiler aborting)."""
    if not isinstance(config, BenchConfig):
        raise TypeError(f"config must be a BenchConfig (e.g. get_preset('small')), got {type(config).__name__}")
    ours = tuple(m for m, record in METHODS.items() if record.family == "svg_lib" and record.backward)
    if method not in ours:
        raise ValueError(f"method must be one of svg_lib's differentiable kernels ({', '.join(ours)}), got {method!r}")
    check_target(target)
    require_libtpu()
    heads = config.heads if heads is None else heads
    with tempfile.TemporaryDirectory(prefix="svg_step_") as tmp:
        profile_dir = os.path.join(tmp, "profile")
        os.makedirs(profile_dir)
        env = dict(os.environ)
        env["LIBTPU_INIT_ARGS"] = " ".join([env.get("LIBTPU_INIT_ARGS", ""),
                                            f"--xla_jf_dump_static_llo_profile_to={profile_dir}"]).strip()
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3]), env.get("PYTHONPATH", "")])
        request = {"problem": config.to_json(), "method": method, "target": target, "heads": heads,
                   "backward": backward, "profile_dir": profile_dir}
        req_path = os.path.join(tmp, "request.json")
        Path(req_path).write_text(json.dumps(request))
        log_path = os.path.join(tmp, "child.log")
        shown = progress_bar(total=None, desc=f"static profile of jax.grad({method}), {heads} head(s) x "
                                              f"{config.tokens:,} tokens, {config.block_q} x {config.block_kv}",
                             unit="s", show=show, delay=0.0)
        start = time.perf_counter()
        with open(log_path, "w") as log:  # libtpu is chatty on stderr
            proc = subprocess.Popen([sys.executable, "-m", "svg_lib.instruments.tpu.step_profile", "--child", req_path],
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                while proc.poll() is None:
                    if time.perf_counter() - start > timeout:
                        proc.kill()
                        proc.wait()
                        raise RuntimeError(f"the static profile of jax.grad({method}) took over {timeout:.0f} s")
                    time.sleep(2.0)
                    shown.update(2.0)
                    shown.set_postfix_str(f"profiles written: {len(glob.glob(os.path.join(profile_dir, '*')))}")
            finally:
                shown.close()
        out_path = req_path + ".out"
        if proc.returncode != 0 or not os.path.exists(out_path):
            tail = "\n".join(line for line in Path(log_path).read_text().splitlines()
                             if "failed:" in line or "Error" in line)[-2000:]
            raise RuntimeError(f"the static profile of jax.grad({method}) failed (exit {proc.returncode}):\n{tail}")
        out = json.loads(Path(out_path).read_text())
    if "error" in out:
        raise RuntimeError(f"the TPU compiler refused jax.grad({method}): {out['error']}")
    if not out["ops"]:
        raise RuntimeError("the compiler wrote no static profile (is LIBTPU_INIT_ARGS overridden?)")
    return StepProfile(method, target, config.to_json(), heads, backward, out["ops"], out["compile_s"], versions())


def model_of_profile(step: StepProfile, forward_cost, backward_cost) -> dict:
    """The training model (`cost.training_model`) for the profiled problem and method, beside the profile.

    Returns {"model": {"forward", "backward", "total"}, "profile": {...the same, and "others"},
    "ratios": {part: model / profile}}. For the planned methods, whose profile simulates every step
    as idle (`StepProfile.tiles_simulated`), "model_as_simulated" adds the model of that program:
    the same grid, every step idle, so that the idle and per-row terms are checked where the tiles
    cannot be; and "anchored", the whole step as the profile prices it plus each computed step's
    body less the idle step simulated in its place (the probes' cycles): the step's cycles with the
    per-head work, the dq copy and XLA's ops that the model leaves out."""
    config = BenchConfig.from_json(step.problem)
    model = training_model(config, forward_cost, backward_cost, heads=step.heads, methods=(step.method,))[step.method]
    profile = {"forward": step.forward, "backward": step.backward_cycles, "others": step.others, "total": step.total}
    out = {"model": model, "profile": profile,
           "ratios": {part: model[part] / profile[part] for part in ("forward", "backward", "total")}}
    if not step.tiles_simulated:
        out["model_as_simulated"] = _model_all_idle(config, step, forward_cost, backward_cost)
        out["ratios_as_simulated"] = {part: out["model_as_simulated"][part] / profile[part]
                                      for part in ("forward", "backward", "total")}
        # the profile, which prices everything but the tile bodies, plus the bodies from the probes: each
        # computed step's body less the idle step the profile simulated in its place
        sim = out["model_as_simulated"]
        out["anchored"] = {part: profile[part] + model[part] - sim[part] for part in ("forward", "backward", "total")}
    return out


def _model_all_idle(config, step, forward_cost, backward_cost) -> dict:
    """The training model of the program the profile simulates for a planned method: its forward and
    backward grids with every step idle (the per-row cost of the forward's rows kept)."""
    record = METHODS[step.method]
    mask = config.mask()
    if record.rounds_to_tiles:
        mask = b3_mask(mask, config.block_q, config.block_kv)
    plan = plan_tiles(mask, config.block_q, config.block_kv)
    idle = forward_cost.per_step["svg_lib"]["idle"]
    rows_f, steps_f = plan.step_class.shape
    _, step_class_t, _ = plan.transposed_tables
    forward = step.heads * (rows_f * steps_f * idle + rows_f * forward_cost.per_row.get("svg_lib", 0.0))
    backward = step.heads * step_class_t.size * idle
    return {"forward": forward, "backward": backward, "total": forward + backward}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    _request_path = sys.argv[2]
    _out = _child(json.loads(Path(_request_path).read_text()))
    Path(_request_path + ".out").write_text(json.dumps(_out))
