"""`python -m svg_lib cost`: simulated cycles per tile body and the plan's cost model."""
from __future__ import annotations

import argparse
import copy
import dataclasses
import sys

from svg_lib.chips import DEFAULT_TARGET, TARGETS
from svg_lib.environment import MissingCompiler, has_libtpu, missing_compiler_message
from svg_lib.cli.common import (Command, add_json_argument, add_problem_arguments, block_size, config_from_args,
                                emit_json, json_to_stdout)
from svg_lib.methods import BACKWARD_METHODS, MODEL_METHODS
from svg_lib.problem import BLOG_SWEEP_V6E_MS
from svg_lib.instruments.tpu.cost import (BLOG_RATIOS, EVIDENCE, REFERENCE_FILE, backward_tile_cost, cost_model,
                              filled_from, load_reference, tile_cost, training_model)
from svg_lib.instruments.tpu.probes import BLOCKS_KIND, FAILING_KIND
from svg_lib.instruments.tpu.step_profile import model_of_profile, profile_gradient

BLOG_SWEEP_BQ = (1024, 3328, 4864)
SWEEP_KINDS = ("free", "svg_masked", "idle")


def _cost_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=tuple(TARGETS), default=DEFAULT_TARGET,
                        help=f"TPU generation to compile for (default {DEFAULT_TARGET})")
    add_problem_arguments(parser, blocks=True, preset="small")  # --preset blog for the case study
    parser.add_argument("--block-kv-compute", type=block_size, metavar="C",
                        help="key chunk inside a tile (default: as kernels pick)")
    parser.add_argument("--sweep", action="store_true",
                        help="also model the blog's BQ sweep (BKV 1536; BQ 1024, 3328, 4864): three more block sizes")
    parser.add_argument("--backward", action="store_true",
                        help="also the backward's kernels (ours fused and split, Splash's) and a training step's model")
    parser.add_argument("--grad", action="store_true",
                        help="also the static profile of the whole training step's attention (jax.grad of --grad-method, "
                             "one compile with the profile on) beside the training model (implies --backward); its time and memory grow "
                             "fast with the grid: keep the problem small (16,128 tokens at 1024 x 512: minutes, 13 GB)")
    parser.add_argument("--grad-method", choices=BACKWARD_METHODS, default="b3",
                        help="the method whose jax.grad --grad profiles (default b3; dense is the one whose tiles the "
                             "profile simulates: the others read their schedules from SMEM, which it reads as 0)")
    parser.add_argument("--refresh", action="store_true", help="recompile the probes even if cached")
    add_json_argument(parser, "also write the cycles, the model and what was asked for beside it as JSON to PATH")


def _model_table(title: str, model: dict, blog: dict | None, failing: dict | None = None) -> str:
    """The model per method; with `failing` (the model at pass rate 0) two columns more: what each
    method costs when no query tile passes the bound's test, the other end of its range."""
    fail_head = f" {'no tile bounded':>16} {'vs B0':>7}" if failing else ""
    lines = [title, f"  {'method':13} {'model cycles':>15} {'vs B0':>7}{fail_head} {'blog vs B0':>11}"]
    for m in MODEL_METHODS:
        if m not in model:
            continue
        b = blog.get(m) if blog else None
        fail = f" {failing[m]:16,.0f} {failing[m + '/b0']:7.2f}" if failing else ""
        lines.append(f"  {m:13} {model[m]:15,.0f} {model[m + '/b0']:7.2f}{fail} {'' if b is None else f'{b:.2f}':>11}")
    if failing:
        lines.append("  (model cycles: every query tile takes the bounded max; no tile bounded: every one fails the\n"
                     "   bound's test and keeps the running max. Real activations fall between; a TPU measures where.)")
    return "\n".join(lines)


def _training_table(model: dict) -> str:
    ratios = model.get("ratios", {})
    lines = ["training step (forward + backward; the backward fused: Splash's for splash_dense, ours for the rest)",
             f"  {'method':13} {'forward':>13} {'backward':>13} {'total':>13} {'vs B0 fwd':>9} {'bwd':>6} {'total':>6}"]
    for m in MODEL_METHODS:
        if m in model:
            r = ratios.get(m, {})
            tail = f" {r['forward']:9.2f} {r['backward']:6.2f} {r['total']:6.2f}" if r else ""
            lines.append(f"  {m:13} {model[m]['forward']:13,.0f} {model[m]['backward']:13,.0f} {model[m]['total']:13,.0f}{tail}")
    return "\n".join(lines)


def _grad_table(compared: dict, method: str) -> str:
    """The training model beside the whole step's profile, part by part."""
    lines = [f"training model vs the whole step's profile, {method}",
             f"  {'part':9} {'model':>13} {'profile':>13} {'model / profile':>16}"]
    model, profile = compared["model"], compared["profile"]
    for part in ("forward", "backward", "total"):
        lines.append(f"  {part:9} {model[part]:13,.0f} {profile[part]:13,.0f} {compared['ratios'][part]:16.3f}")
    lines.append(f"  (the profile's total holds XLA's ops too, {profile['others']:,} cycles, which the model leaves out)")
    if "model_as_simulated" in compared:
        sim = compared["model_as_simulated"]
        lines.append(f"  the model of what the profile simulates ({method}'s grids, every step idle):")
        for part in ("forward", "backward", "total"):
            lines.append(f"  {part:9} {sim[part]:13,.0f} {profile[part]:13,.0f} "
                         f"{compared['ratios_as_simulated'][part]:16.3f}")
        anchored = compared["anchored"]
        lines.append(f"  the whole step, the profile's cycles plus each computed step's body less the idle step simulated "
                     f"in its place: forward {anchored['forward']:,.0f}, backward {anchored['backward']:,.0f}, total "
                     f"{anchored['total']:,.0f} (model / this: backward {model['backward'] / anchored['backward']:.3f}, "
                     f"total {model['total'] / anchored['total']:.3f})")
    return "\n".join(lines)


def _cost_run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.grad and not has_libtpu():  # before any probing: the committed cycles cannot stand in for a compile
        raise MissingCompiler(missing_compiler_message("--grad (the static profile of a whole jax.grad)"))
    bq, bkv = config.block_q, config.block_kv
    cost = tile_cost(args.target, config, refresh=args.refresh)
    committed = cost.cache_path == str(REFERENCE_FILE)  # no libtpu here: the committed cycles, said so
    if committed:
        reference = load_reference()
        print(f"(the TPU compiler, libtpu, is not installed: these are the committed cycles of {reference['date']}, "
              f"libtpu {reference['versions']['libtpu']}, from svg_lib/data/{REFERENCE_FILE.name}; install libtpu "
              "to simulate other tiles)", file=sys.stderr)
    # B0 with padded keys runs Splash's block-mask body; where that was not simulated, the model
    # prices it at Splash's mask-free body, a lower bound (printed below)
    b0_lower_bound = BLOCKS_KIND in cost.unsimulated
    cost = filled_from(cost, blocks_as_free=True) if b0_lower_bound else cost
    model = cost_model(config, cost)
    failing = cost_model(config, cost, pass_rate=0.0) if FAILING_KIND in cost.per_step.get("svg_lib", {}) else None
    out = {"evidence": EVIDENCE, "cycles_from": "committed reference" if committed else "this machine's compiler",
           "problem": config.to_json(), "preset": config.name, "target": args.target,
           "tile_cost": cost.to_json(), "b0_lower_bound": b0_lower_bound, "model": model,
           "model_no_tile_bounded": failing, "blog_ratios": BLOG_RATIOS}
    sweep = {}
    if args.sweep:
        for sq in BLOG_SWEEP_BQ:
            # B2 needs svg_lib's free, masked and idle steps; the per-row cost (well under 1 % here) is left out
            at = dataclasses.replace(config, block_q=sq, block_kv=1536, block_kv_compute=None)
            c = cost if (sq, 1536) == (bq, bkv) else tile_cost(args.target, at, kernels=("svg_lib",),
                                                               kinds=SWEEP_KINDS, per_row=False, refresh=args.refresh)
            c = copy.deepcopy(c)
            c.per_row = {}  # the same terms at every BQ
            sweep[sq] = {"model_cycles": cost_model(at, c, methods=("b2",))["b2"],
                         "blog_ms": BLOG_SWEEP_V6E_MS.get(sq), "tile_cost": c.to_json()}
        out["sweep_b2_bkv1536"] = sweep
    if args.grad:
        args.backward = True
    if args.backward:
        bwd = backward_tile_cost(args.target, block_q=bq, block_kv=bkv, block_kv_compute=cost.block_kv_compute,
                                 head_dim=config.head_dim, kinds=("free", "svg_masked"), refresh=args.refresh)
        out["backward_cost"] = {k: v for k, v in bwd.to_json().items() if k != "raw"}
        out["training_model"] = training_model(config, cost, bwd)
    if args.grad:
        step = profile_gradient(config, args.grad_method, args.target)
        out["grad_profile"] = step.to_json()
        out["grad_vs_model"] = model_of_profile(step, cost, bwd)
    out["tile_cost"].pop("raw", None)
    if json_to_stdout(args):  # the JSON takes the tables' place
        emit_json(args, out)
        return 0
    print(cost.table())
    print()
    blog = BLOG_RATIOS if config.is_blog_problem and (bq, bkv) == (3328, 1536) else None
    print(_model_table(f"cost model: sum over grid steps of the step's simulated body cost ({config})", model, blog,
                       failing))
    if b0_lower_bound:
        print(f"  (splash_dense: Splash's {BLOCKS_KIND} body could not be simulated on a {args.target}; priced at its "
              f"mask-free body, a lower bound for B0, so every 'vs B0' above is an upper bound)")
    if args.backward:
        print()
        print(bwd.table())
        print(_training_table(out["training_model"]))
    if args.grad:
        print()
        print(step.table())
        print(_grad_table(out["grad_vs_model"], args.grad_method))
    if sweep:
        base = sweep[3328]["model_cycles"] if 3328 in sweep else None
        print("\nB2 block-size sweep, BKV 1536 (model cycles without the per-row terms; blog ms measured on a v6e)")
        for sq, row in sweep.items():
            rel = f"{row['model_cycles'] / base:.3f}" if base else ""
            blog_rel = f"{row['blog_ms'] / 54.12:.3f}" if row["blog_ms"] else ""
            print(f"  BQ {sq:5}  {row['model_cycles']:15,.0f}  vs BQ 3328 {rel:>6}   blog {row['blog_ms']} ms, "
                  f"vs BQ 3328 {blog_rel}")
    emit_json(args, out)
    return 0


COMMAND = Command("cost", "simulated cycles per tile body (TPU compiler's static profile) and the plan's cost model",
            _cost_arguments, _cost_run)
