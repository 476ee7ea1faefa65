"""Price the B3 forward's optional tile-mass side output and skip-softmax branch on a v6e's static profile.

    python tools/tile-mass-profile.py [--write]

Compile-only (libtpu, no TPU): probe kernels built like the cost probes' "free" kind
(`svg_lib.instruments.tpu.probes`: one head, every step mask-free, a query tile's first step with the
running max and the switch to the bound, later steps bounded), each in four variants:

    free          the tile body as the kernels run it by default
    mass          with extensions.observed's tile mass on a tile that passed the bound's test (every step
                  records its l; the masses at finish)
    mass_running  the same on a tile that failed it (the running-max body, which records its m too)
    skip_tested   with skip-softmax on, every slice tested and (forced by the program id) not skipped
    skip_skipped  with skip-softmax on, every slice tested and (forced) skipped: q k^T and the test only

Cycles per grid step = (cycles at 4 steps - at 2) / 2; per query tile (init and finish) = (2 query
tiles - 1) less 2 steps, as the cost probes measure them. These probes are not part of the probe
digest's set (`probes.probed_digest`): they are this script's. `--write` stores the figures in
svg_lib/data/tile_mass_cost.json. Evidence kind: simulated by the TPU compiler's static profile.
"""
from __future__ import annotations

import functools
import math
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "svg_lib" / "data" / "tile_mass_cost.json"
BLOCKS = ((3328, 1536, 512), (512, 256, 256))   # block_q, block_kv, block_kv_compute
VARIANTS = ("free", "mass", "mass_running", "skip_tested", "skip_skipped")
SKIP_THRESHOLD = 10.0  # any value: the probes force the branch; the data never reach the simulator


def probe_kernel(block_q, block_kv, block_kv_compute, rows, steps, variant, head_dim=128):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from svg_lib.kernels import forward as kf
    from svg_lib.extensions import observed as ko

    mass_on = variant.startswith("mass")
    skip_on = variant.startswith("skip")
    lanes = ko.tile_mass_lanes(steps)

    def kernel(q_ref, k_ref, v_ref, *rest):
        if mass_on:
            o_ref, mass_ref, m_ref, l_ref, acc_ref, flag_ref, record_ref, m_record_ref = rest
        elif skip_on:
            (o_ref, m_ref, l_ref, acc_ref, flag_ref, seen_ref), mass_ref = rest, None
        else:
            (o_ref, m_ref, l_ref, acc_ref, flag_ref), mass_ref = rest, None
        i, s = pl.program_id(1), pl.program_id(2)
        state = (m_ref, l_ref, acc_ref)
        mass = ko.TileMass(record_ref, m_record_ref, s) if mass_on else None
        body, extra = kf.online_softmax_tile, {}
        if skip_on:
            # forced from the program id, which the simulator follows exactly: true (skip_tested, every
            # slice runs) or false (skip_skipped, every slice skips). (A scalar-prefetched flag, tried, left
            # the simulator unable to tell the two apart: both priced the same.)
            forced = (s < steps) if variant == "skip_tested" else (s >= steps)
            gate = (lambda run: run | forced) if variant == "skip_tested" else (lambda run: run & forced)
            body, extra = ko.skip_softmax_tile, dict(threshold=SKIP_THRESHOLD, seen_ref=seen_ref, gate=gate)

        if mass_on:  # the record inside each body's branch, as the kernel has it
            body, extra = functools.partial(ko.recording_tile, mass=mass), {}

        def tile(bounded):
            body(q_ref, k_ref, v_ref, *state, keep=None, q_start=i * block_q,
                                   k_start=s * block_kv, block_kv_compute=block_kv_compute, interpret=False,
                                   bounded=bounded, **extra)

        def first_step():  # on the bound, then its check, as the kernels' first step
            kf.start_bound(q_ref, state[0], jnp.float32(1.0))
            tile(True)
            kf.check_bound(*state, flag_ref, threshold=block_kv * math.exp(-kf.BOUND_SLACK))

        @pl.when(s == 0)
        def _():
            kf.init_state(*state, flag_ref)
            if mass_on:
                mass.start()
            if skip_on:  # as the observed kernel's start: no score seen yet
                seen_ref[...] = jnp.full(seen_ref.shape, kf.MASK_VALUE, jnp.float32)

        @pl.when(s < steps)
        def _():
            pl.when(s == 0)(first_step)
            pl.when(s > 0)(functools.partial(tile, variant != "mass_running"))

        @pl.when(s == steps - 1)
        def _():
            kf.finish(*state, o_ref)
            if mass_on:
                ko.finish_tile_mass(m_ref, l_ref, mass, mass_ref, q_start=i * block_q, q_tokens=rows * block_q)

    out_shape = [jax.ShapeDtypeStruct((1, rows * block_q, head_dim), jnp.bfloat16)]
    out_specs = [pl.BlockSpec((None, block_q, head_dim), lambda h, i, s: (h, i, 0))]
    scratch = kf.softmax_scratch(block_q, head_dim, bounded=True)
    if mass_on:
        out_shape.append(jax.ShapeDtypeStruct((1, 1, rows * lanes), jnp.float32))
        out_specs.append(pl.BlockSpec((None, 1, lanes), lambda h, i, s: (h, 0, i)))
        scratch = scratch + [pltpu.VMEM((block_q, lanes), jnp.float32)] * 2
    if skip_on:
        scratch = scratch + [pltpu.VMEM((block_q, kf.LANES), jnp.float32)]  # the running max beside the bound
    q_spec = pl.BlockSpec((None, block_q, head_dim), lambda h, i, s, *t: (h, i, 0))
    kv_spec = pl.BlockSpec((None, block_kv, head_dim), lambda h, i, s, *t: (h, s, 0))
    out_specs = [pl.BlockSpec(spec.block_shape, (lambda f: lambda h, i, s, *t: f(h, i, s))(spec.index_map))
                 for spec in out_specs]
    call = pl.pallas_call(
        kernel, grid=(1, rows, steps), in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=out_specs, out_shape=out_shape, scratch_shapes=scratch,
        compiler_params=kf.compiler_params(None), name=f"tile_mass_probe_{variant}")
    shapes = [((1, rows * block_q, head_dim), "bfloat16"), ((1, steps * block_kv, head_dim), "bfloat16"),
              ((1, steps * block_kv, head_dim), "bfloat16")]
    return call, shapes


def child(profile_dir: str, bundle_dir: str) -> list[dict]:
    from svg_lib.instruments.tpu.compiler import compile_fn
    from svg_lib.instruments.tpu.probes import _clear, _read_dumps

    out = []
    for bq, bkv, c in BLOCKS:
        for variant in VARIANTS:
            for rows, steps in ((1, 2), (1, 4), (2, 2)):
                _clear(profile_dir, bundle_dir)
                start = time.perf_counter()
                fn, shapes = probe_kernel(bq, bkv, c, rows, steps, variant)
                try:
                    compile_fn(fn, shapes, "v6e")
                    row = _read_dumps(profile_dir, bundle_dir)
                except Exception as err:  # keep going; report
                    row = {"cycles": None, "error": str(err).splitlines()[0][:300]}
                row.update(block_q=bq, block_kv=bkv, block_kv_compute=c, variant=variant, rows=rows, steps=steps,
                           compile_s=round(time.perf_counter() - start, 1))
                print(json.dumps(row), file=sys.stderr, flush=True)
                out.append(row)
    return out


def summarise(rows: list[dict]) -> list[dict]:
    by = {(r["block_q"], r["variant"], r["rows"], r["steps"]): r for r in rows}
    groups = []
    for bq, bkv, c in BLOCKS:
        g = {"block_q": bq, "block_kv": bkv, "block_kv_compute": c, "head_dim": 128, "per_step": {}, "per_query_tile": {},
             "bundles": {}}
        for v in VARIANTS:
            a, b, two = by[(bq, v, 1, 2)], by[(bq, v, 1, 4)], by[(bq, v, 2, 2)]
            if None in (a["cycles"], b["cycles"], two["cycles"]):
                g["per_step"][v] = None
                continue
            step = (b["cycles"] - a["cycles"]) / 2
            g["per_step"][v] = step
            g["per_query_tile"][v] = two["cycles"] - a["cycles"] - 2 * step
            g["bundles"][v] = b.get("bundles")
        free = g["per_step"]["free"]
        if free:
            g["vs_free_per_step"] = {v: round(x / free - 1, 4) for v, x in g["per_step"].items() if x is not None}
        groups.append(g)
    return groups


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        Path(sys.argv[2]).write_text(json.dumps(child(sys.argv[3], sys.argv[4])))
        return
    import importlib.metadata as md

    with tempfile.TemporaryDirectory(prefix="tile_mass_") as tmp:
        profile, bundles, result = (os.path.join(tmp, n) for n in ("profile", "bundles", "out.json"))
        os.makedirs(profile), os.makedirs(bundles)
        env = dict(os.environ)
        env["LIBTPU_INIT_ARGS"] = " ".join([env.get("LIBTPU_INIT_ARGS", ""), f"--xla_jf_dump_static_llo_profile_to={profile}",
                                            f"--xla_jf_dump_to={bundles}", "--xla_jf_dump_llo_text=true",
                                            "--xla_jf_dump_llo_pass_label_regex=final_bundles"]).strip()
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        subprocess.run([sys.executable, __file__, "--child", result, profile, bundles], env=env, check=True)
        rows = json.loads(Path(result).read_text())
    groups = summarise(rows)
    for g in groups:
        print(f"v6e {g['block_q']}x{g['block_kv']} (key slices of {g['block_kv_compute']}): cycles per grid step")
        for v in VARIANTS:
            x = g["per_step"].get(v)
            rel = g.get("vs_free_per_step", {}).get(v)
            print(f"  {v:13s} {x!s:>10s}  {'' if rel is None else f'{100 * rel:+.1f} %'}"
                  f"   per query tile {g['per_query_tile'].get(v)}")
    if "--write" in sys.argv:
        import jax

        from svg_lib.instruments.tpu.probes import probed_digest
        record = {"evidence": "simulated by the TPU compiler's static LLO profile (compile-only, not measured)",
                  "date": time.strftime("%Y-%m-%d", time.gmtime()), "target": "v6e",
                  "versions": {"jax": jax.__version__, "libtpu": md.version("libtpu"), "source": probed_digest()},
                  "note": ("The B3 tile body (kernels.forward.online_softmax_tile, mask-free, bf16, head_dim 128, a "
                           "query tile's first step with the running max and the switch to the bound, later steps "
                           "bounded, as the cost probes' 'free') with and without its optional side output "
                           "(mass: extensions.observed's tile mass on a query tile that passed the bound's test, each "
                           "visited step records the row's l so far in one lane, a cross-lane sum and a select; "
                           "mass_running: on a tile that failed it, its running-max body records its m too (compare "
                           "it with cost_reference.json's free_running, not with free); finish brings "
                           "lanes to the final m, divides, averages over rows and takes lane differences; the "
                           "record runs inside the tile body's branch, where its work overlaps the matmuls) and its optional skip-softmax branch (skip_tested: every slice tested, "
                           "none skipped; skip_skipped: every slice tested and skipped; both forced by the "
                           "program id, which the profile follows, since it cannot see data). per_step: cycles "
                           "per grid step, (4 steps - 2 steps) / 2; per_query_tile: (2 query tiles - 1) less 2 "
                           "steps. Written by tools/tile-mass-profile.py; its probes are not in the probe "
                           "digest's set ('source' is that digest, for the tree they were probed from). At 512 x "
                           "256 the step is bound by its DMA and overhead (the two matmuls alone: 796 cycles), so "
                           "the bodies barely differ there, and skip_tested's test was folded away by the compiler "
                           "(it equals free, 2 more bundles): the branch's overhead is read at 3328 x 1536 only."),
                  "groups": groups}
        OUT.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
