"""Tests of `python -m svg_lib`: the plan command, its JSON, its errors, and the command registry."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from svg_lib.cli import commands, main
from svg_lib.core.geometry import VideoGeometry
from svg_lib.core.svg_masks import SVGMask
from svg_lib.core.planner import plan_tiles
from svg_lib.environment import libtpu_requirement
from svg_lib.teaching.plots import ascii_tile_map

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def expected_stats(frames, height, width, density, block_q, block_kv, text_tokens=0, sink=True):
    mask = SVGMask.spatial(VideoGeometry(frames, height, width, text_tokens), density, first_frame_sink=sink)
    return plan_tiles(mask, block_q, block_kv).stats


def test_json_is_plan_stats(capsys):
    code, out, err = run(capsys, "plan", "--frames", "4", "--height", "10", "--width", "20",
                         "--density", "0.3", "--block-q", "256", "--block-kv", "128", "--json")
    assert code == 0 and err == ""
    assert json.loads(out) == expected_stats(4, 10, 20, 0.3, 256, 128)
    assert len(out.strip().splitlines()) == 1  # exactly one JSON object, nothing else


def test_preset_supplies_defaults_and_flags_override_them(capsys):
    code, out, _ = run(capsys, "plan", "--preset", "small", "--json")
    assert code == 0
    assert json.loads(out) == expected_stats(21, 16, 30, 0.35, 512, 256)
    code, out, _ = run(capsys, "plan", "--preset", "small", "--block-q", "1024", "--density", "0.2", "--json")
    assert code == 0
    assert json.loads(out) == expected_stats(21, 16, 30, 0.2, 1024, 256)


def test_no_sink_and_text_tokens(capsys):
    code, out, _ = run(capsys, "plan", "--preset", "tiny", "--text-tokens", "16", "--no-sink", "--json")
    assert code == 0
    stats = json.loads(out)
    assert stats == expected_stats(3, 8, 16, 0.35, 128, 128, text_tokens=16, sink=False)
    assert stats != expected_stats(3, 8, 16, 0.35, 128, 128, text_tokens=16, sink=True)


def test_text_output_describes_the_plan_and_draws_the_map(capsys):
    code, out, err = run(capsys, "plan", "--preset", "small")
    assert code == 0 and err == ""
    mask = SVGMask.spatial(VideoGeometry(21, 16, 30), 0.35)
    plan = plan_tiles(mask, 512, 256)
    s = plan.stats
    report = mask.tile_aligned(512, 256).report
    assert ascii_tile_map(plan) in out
    assert f"band |q - k| <= {mask.band_width:,}" in out
    assert f"{s['q_tiles']} x {s['kv_tiles']} = {s['tiles_total']:,} tiles" in out
    assert f"B1 naive      visits {s['tiles_visited']:,} tiles" in out
    assert f"masks {s['tiles_masked']:,}" in out
    assert f"B3 aligned    visits {s['b3_tiles_visited']:,}" in out
    assert f"masks {s['b3_tiles_masked']:,}" in out
    assert f"+{report.pairs_added:,} pairs added, -{report.pairs_dropped:,} dropped" in out
    assert "budget error" in out and "analytic" in out


@pytest.mark.parametrize("argv, words", [
    (["--preset", "small", "--block-q", "100"], ["--block-q", "multiple of 128", "100"]),
    (["--preset", "small", "--block-kv", "0"], ["--block-kv", "multiple of 128"]),
    (["--preset", "small", "--density", "0"], ["--density", "(0, 1]"]),
    (["--preset", "small", "--density", "1.5"], ["--density", "(0, 1]"]),
    (["--preset", "small", "--density", "nan"], ["--density", "(0, 1]"]),
    (["--frames", "21", "--height", "45"], ["--width", "--density", "--block-q", "--preset"]),
    (["--preset", "small", "--frames", "0"], ["--frames", "positive"]),
    (["--preset", "small", "--frames", "two"], ["--frames", "invalid int"]),
    (["--preset", "huge"], ["--preset", "tiny", "blog"]),
    (["--preset", "tiny", "--text-tokens", "200", "--density", "0.5"], ["text tokens", "density"]),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, argv, words):
    code, out, err = run(capsys, "plan", *argv, "--json")
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("python -m svg_lib plan: error:")
    for word in words:
        assert word in err


def test_missing_command_and_help(capsys):
    code, out, err = run(capsys)
    assert code == 2 and "COMMAND" in err
    code, out, err = run(capsys, "plan", "--help")
    assert code == 0 and "--block-q" in out and "--preset" in out


def test_registry_builds_the_subcommands():
    names = [c.name for c in commands()]
    assert names == ["plan", "bench", "lower", "compile", "tune", "cost", "vmem", "sharded", "report", "frontier"]
    for name in names:  # every command parses its own --help without running anything
        code = main([name, "--help"])
        assert code == 0


def test_vmem_needs_a_question(capsys):
    code, out, err = run(capsys, "vmem")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "nothing asked: give --sweep (" in err and "or --largest (" in err


def test_vmem_sweep_holds_the_estimate_against_the_compiler(tpu_compiler, tmp_path, capsys):
    path = tmp_path / "sweep.json"
    code, out, err = run(capsys, "vmem", "--sweep", "--methods", "dense", "--targets", "v6e", "--blocks", "512x512",
                         "--dtypes", "bfloat16", "--json", str(path))
    assert code == 0, err
    (row,) = json.loads(path.read_text())
    assert (row["method"], row["target"], row["block_q"], row["block_kv"]) == ("dense", "v6e", 512, 512)
    assert row["estimate_fits"] and row["compiled"] and row["agrees"]
    assert "1 points, 0 disagreements" in out


def test_blog_plan_stats():
    # the plan and its stats, B3 rounding included, at the case study's size
    stats = expected_stats(21, 45, 80, 0.35, 3328, 1536)
    assert stats["tokens"] == 75_600


def test_module_entry_point_at_blog_size():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, "-m", "svg_lib", "plan", "--preset", "blog", "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["tokens"] == 21 * 45 * 80 == 75_600
    assert (stats["block_q"], stats["block_kv"]) == (3328, 1536)
    assert stats["tiles_total"] == math.ceil(75_600 / 3328) * math.ceil(75_600 / 1536) == 23 * 50
    assert stats["tiles_full"] + stats["tiles_masked"] == stats["tiles_visited"]
    assert stats["b3_tiles_visited"] < stats["tiles_visited"]
    assert stats["b3_tiles_masked"] < stats["tiles_masked"]
    assert abs(stats["b3_budget_error"]) < 0.01
    assert stats == expected_stats(21, 45, 80, 0.35, 3328, 1536)


def test_cost_reads_the_problem_flags_into_one_config(monkeypatch, capsys):
    """`cost` takes the same problem flags as plan, bench and lower; the model sees the config they describe."""
    cost_cli = sys.modules["svg_lib.cli.cost"]
    seen = {}

    def fake_tile_cost(target, config, **kwargs):
        seen["config"] = config
        raise SystemExit(0)  # the probes' compile is tests/test_cost.py's business

    monkeypatch.setattr(cost_cli, "tile_cost", fake_tile_cost)
    with pytest.raises(SystemExit):
        main(["cost", "--preset", "small", "--heads", "3", "--block-q", "1024", "--density", "0.2"])
    config = seen["config"]
    assert (config.heads, config.block_q, config.density, config.block_kv) == (3, 1024, 0.2, 256)
    assert main(["cost", "--block-q", "100"]) == 2
    assert "multiple of 128" in capsys.readouterr().err


# -- output paths: every flag that writes a file is checked when the flags are read ------------
# and treats folders alike: a missing folder is created when the file is written, and --help says so

WRITERS = [("report", "--out", []), ("frontier", "--plot", []), ("frontier", "--json", []),
           ("bench", "--json", ["--preset", "tiny"]), ("lower", "--json", ["--preset", "tiny"]),
           ("compile", "--json", ["--preset", "tiny"]), ("tune", "--json", ["--preset", "tiny"]),
           ("vmem", "--json", []), ("sharded", "--json", []), ("plan", "--json", ["--preset", "tiny"]),
           ("cost", "--json", []), ("report", "--json", [])]


@pytest.mark.parametrize("command, flag, extra", WRITERS)
def test_an_unwritable_output_is_refused_before_any_work(tmp_path, capsys, nothing_runs, command, flag, extra):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    code, out, err = run(capsys, command, *extra, flag, str(a_file / "x.out"))
    assert code == 2 and out == "" and nothing_runs == []
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"python -m svg_lib {command}: error: argument {flag}: cannot write")
    assert "a_file" in err and "is a file, not a folder" in err


@pytest.mark.parametrize("command, flag, extra", WRITERS)
def test_every_output_flag_takes_a_missing_folder_and_says_so(tmp_path, capsys, nothing_runs, command, flag, extra):
    missing = tmp_path / "missing" / "deeper"
    code, out, err = run(capsys, command, *extra, flag, str(missing / "x.out"))
    assert code == 0 and err == "" and len(nothing_runs) == 1
    assert not missing.parent.exists()  # created when the file is written, not while the flags are read
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    help_text = " ".join(out.split())
    assert "a missing folder is created" in help_text[help_text.index(flag + " "):]


def test_written_files_create_their_folder(tmp_path, capsys, monkeypatch):
    from svg_lib.cli.common import write_json

    write_json(str(tmp_path / "a" / "b" / "x.json"), {"x": 1})
    assert json.loads((tmp_path / "a" / "b" / "x.json").read_text()) == {"x": 1}
    monkeypatch.setattr("svg_lib.cli.frontier.run", lambda **kw: {"records": [], "masks": list(kw["masks"])})
    path = tmp_path / "new" / "records.json"
    code, out, _ = run(capsys, "frontier", "--quiet", "--json", str(path))
    assert code == 0 and f"wrote 0 records to {path}" in out and json.loads(path.read_text())["records"] == []


def test_every_preset_flag_offers_every_preset(capsys):
    from svg_lib.problem import PRESETS

    for command in commands():
        code, out, _ = run(capsys, command.name, "--help")
        if "--preset" in out:
            assert "{" + ",".join(PRESETS) + "}" in out, command.name
    code, out, err = run(capsys, "plan", "--preset", "walkthrough", "--json")
    assert code == 0, err
    assert json.loads(out) == expected_stats(21, 8, 15, 0.35, 256, 128)
    err = refused(capsys, "plan", "--frames", "3")
    assert "--preset " + "|".join(PRESETS) in err


def test_output_path_checks(tmp_path):
    import argparse

    from svg_lib.cli.common import output_file, output_folder

    assert output_file(str(tmp_path / "new.json")) == str(tmp_path / "new.json")
    assert output_folder(str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []  # checking writes nothing that stays
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder; give a file name in it"):
        output_file(str(tmp_path))
    if os.geteuid() != 0:  # root may write anywhere
        read_only = tmp_path / "read_only"
        read_only.mkdir(mode=0o555)
        with pytest.raises(argparse.ArgumentTypeError, match="refuses new files"):
            output_file(str(read_only / "x.json"))
        with pytest.raises(argparse.ArgumentTypeError, match="refuses new files"):
            output_folder(str(read_only / "report"))


# -- cost without the TPU compiler: the committed cycles where they exist, else what to install --

@pytest.fixture
def without_libtpu(monkeypatch, tmp_path):
    """As on a machine without the libtpu wheel: nothing compiles, and nothing is cached yet."""
    import svg_lib.environment as environment
    import svg_lib.instruments.tpu.cost as cost

    monkeypatch.setattr(environment, "has_libtpu", lambda: False)  # what require_libtpu asks
    monkeypatch.setattr(cost, "has_libtpu", lambda: False)
    monkeypatch.setenv("SVG_LIB_CACHE_DIR", str(tmp_path / "cache"))


def test_cost_grad_without_libtpu_says_what_to_install(without_libtpu, capsys, monkeypatch):
    import svg_lib.cli.cost as cost_command

    monkeypatch.setattr(cost_command, "has_libtpu", lambda: False)
    code, out, err = run(capsys, "cost", "--preset", "small", "--grad")
    assert code != 0 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "--grad" in err and "pip install" in err


@pytest.mark.parametrize("argv", [["--preset", "blog"], ["--preset", "blog", "--sweep", "--backward"],
                                  ["--preset", "small"], ["--preset", "blog", "--target", "v5e"]])
def test_cost_without_libtpu_reads_the_committed_cycles(without_libtpu, capsys, argv):
    from svg_lib.instruments.tpu.cost import load_reference

    code, out, err = run(capsys, "cost", *argv)
    assert code == 0, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "libtpu, is not installed: these are the committed cycles of " + load_reference()["date"] in err
    assert "cost model" in out and "b3" in out
    code, out, err = run(capsys, "cost", *argv, "--json")
    assert code == 0 and json.loads(out)["cycles_from"] == "committed reference"


@pytest.mark.parametrize("argv", [["--preset", "blog", "--block-q", "1024"], ["--preset", "blog", "--target", "v4"],
                                  ["--preset", "small", "--head-dim", "64"], ["--preset", "blog", "--refresh"]])
def test_cost_without_libtpu_and_without_committed_cycles_says_what_to_install(without_libtpu, capsys, argv):
    code, out, err = run(capsys, "cost", *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("python -m svg_lib cost: error: simulating ")
    assert f"pip install '{libtpu_requirement()}'" in err and "pip install -e '.[tpu-compile]'" in err
    assert "the committed reference has v5e 512 x 256, v5e 3328 x 1536, v6e 512 x 256, v6e 3328 x 1536)" in err


def test_quiet_silences_progress_bars_only(capsys, monkeypatch):
    from svg_lib.progress import QUIET_ENV, bar, is_quiet, set_quiet

    monkeypatch.delenv(QUIET_ENV, raising=False)
    code, out, err = run(capsys, "plan", "--preset", "tiny", "--json", "--quiet")
    assert code == 0 and json.loads(out)["tokens"] == 384  # results print as ever
    assert is_quiet() and bar(total=3, show=True).disable  # the run set it for every bar of the process
    code, _, _ = run(capsys, "plan", "--preset", "tiny", "--json")
    assert code == 0 and not is_quiet() and not bar(total=3, show=True).disable and bar(total=3, show=False).disable
    monkeypatch.setenv(QUIET_ENV, "1")
    assert is_quiet() and bar(total=3).disable
    set_quiet(False)
    for command in commands():  # every command takes it
        code, out, _ = run(capsys, command.name, "--help")
        assert code == 0 and "--quiet" in out


def test_a_density_the_mask_cannot_honour_is_one_warning_line(capsys):
    code, out, err = run(capsys, "plan", "--preset", "tiny", "--density", "0.001", "--json")
    assert code == 0 and json.loads(out)["pair_density"] > 0.7
    assert err.startswith("python -m svg_lib plan: warning: density 0.001 asks for 0.10% of the pairs but the mask "
                          "keeps 72.4% at 384 tokens") and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("the smallest density that means something at this size is about 0.72")
    code, out, err = run(capsys, "plan", "--preset", "tiny", "--json")  # 0.35: nothing to say
    assert code == 0 and err == ""


# -- flags refused while they are read: one line naming the value and what works, nothing run ----

@pytest.fixture
def nothing_runs(monkeypatch):
    """Every command's run replaced by a recorder: a refusal while the flags are read leaves it empty."""
    import dataclasses

    import svg_lib.cli as cli

    ran = []
    monkeypatch.setattr(cli, "COMMANDS", tuple(dataclasses.replace(c, run=lambda args: ran.append(args) or 0)
                                               for c in cli.COMMANDS))
    return ran


def refused(capsys, command, *argv):
    """The one stderr line of a refused command line (exit status 2, nothing on stdout)."""
    code, out, err = run(capsys, command, *argv)
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"python -m svg_lib {command}: error:")
    return err


def test_an_unknown_topology_names_the_valid_ones(nothing_runs, capsys):
    from svg_lib.chips import check_topology

    err = refused(capsys, "sharded", "--topology", "v9:2x4")
    assert "'v9:2x4'" in err and "v6e:AxB" in err and "v5e:AxB" in err and "tpu7x:AxBxC" in err
    assert "e.g. v6e:2x4" in err and nothing_runs == []
    for bad in ("v6e", "v6e:2x", "v6e:0x4", "v6e:2x4x1x1"):
        assert f"{bad!r}" in refused(capsys, "sharded", "--topology", bad)
    assert check_topology("v6e:2x4") == "v6e:2x4" and check_topology("v7x:2x2x1") == "tpu7x:2x2x1"


def test_compile_only_topology_refuses_a_bad_name_before_libtpu(monkeypatch):
    import svg_lib.instruments.tpu.compiler as compiler

    monkeypatch.setattr(compiler, "require_libtpu", lambda: pytest.fail("libtpu was asked for"))
    with pytest.raises(ValueError, match=r"unknown TPU topology 'v9:2x4'; .* v6e:AxB"):
        compiler.compile_only_topology("v6e", "v9:2x4")


HEAD_FLAGS = [(command, ["--preset", "tiny"], flag) for command in ("bench", "lower", "compile", "tune", "cost")
              for flag in ("--heads", "--head-dim")] + [("sharded", [], "--heads")]


@pytest.mark.parametrize("command, extra, flag", HEAD_FLAGS)
def test_zero_heads_are_refused_while_the_flags_are_read(nothing_runs, capsys, command, extra, flag):
    err = refused(capsys, command, *extra, flag, "0")
    assert f"argument {flag}: must be a positive integer (1 or more), got 0" in err and nothing_runs == []


@pytest.mark.parametrize("argv, words", [
    (["--block-q", "100,256"], ["argument --block-q", "got 100", "multiple of 128", "try 128"]),
    (["--block-kv", "128,300"], ["argument --block-kv", "got 300", "nearest valid sizes are 256 and 384"]),
    (["--block-q", "12x"], ["argument --block-q", "comma-separated tile sizes", "'12x'"]),
])
def test_tune_refuses_a_bad_tile_size_before_timing_any(nothing_runs, capsys, argv, words):
    err = refused(capsys, "tune", "--preset", "tiny", *argv)
    assert all(word in err for word in words) and nothing_runs == []


def test_tune_refuses_a_pair_that_cannot_run_before_timing_any(monkeypatch, capsys):
    import svg_lib.cli.tune as tune_command

    monkeypatch.setattr(tune_command, "tune", lambda *a, **kw: pytest.fail("tune ran"))
    err = refused(capsys, "tune", "--preset", "tiny", "--block-q", "128,1024", "--block-kv", "128")
    assert "--block-q 1024 with --block-kv 128 cannot run" in err and "384 tokens" in err
    assert "give only sizes that fit" in err


@pytest.mark.parametrize("command, argv, flag", [("sharded", ["--block-q", "100"], "--block-q"),
                                                 ("compile", ["--preset", "tiny", "--sweep-block-q", "1024,100"],
                                                  "--sweep-block-q"),
                                                 ("vmem", ["--sweep", "--blocks", "512x100"], "--blocks"),
                                                 ("bench", ["--preset", "tiny", "--block-kv-compute", "100"],
                                                  "--block-kv-compute")])
def test_every_tile_size_flag_is_checked_while_read(nothing_runs, capsys, command, argv, flag):
    err = refused(capsys, command, *argv)
    assert f"argument {flag}:" in err and "got 100 (try 128)" in err and nothing_runs == []


# -- long runs say what they do before they start, and show their progress ----------------------

@pytest.mark.parametrize("argv, masks, words", [
    (["--json", "r.json"], ("svg_b3", "radial", "sliding", "pooled", "semantic"),
     ["(semantic added to the table's masks", "--masks svg_b3,radial,sliding,pooled leaves it out", "minutes"]),
    (["--json", "r.json", "--masks", "svg_b3,radial,sliding,pooled"], ("svg_b3", "radial", "sliding", "pooled"), []),
    ([], ("svg_b3", "radial", "sliding", "pooled"), []),
    (["--masks", "radial,semantic"], ("radial", "semantic"), ["semantic tiles run k-means", "minutes"]),
])
def test_frontier_says_which_masks_it_prices_and_why(tmp_path, capsys, monkeypatch, argv, masks, words):
    """The records' default adds semantic tiles to the table's masks: said in the one line before the minutes of
    work, with the flag that leaves them out; masks asked for are priced as asked."""
    import svg_lib.cli.frontier as frontier_command

    asked = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(frontier_command, "run", lambda **kw: asked.append(kw["masks"]) or {"records": []})
    monkeypatch.setattr(frontier_command, "frontier", lambda **kw: asked.append(kw["masks"]) or {})
    monkeypatch.setattr(frontier_command, "plot", lambda result, path: None)
    monkeypatch.setattr(frontier_command, "table", lambda result: "the table")
    code, out, err = run(capsys, "frontier", *argv)
    assert code == 0 and asked == [masks]
    (line,) = err.strip().splitlines()  # one line, before the work
    assert line.startswith(f"frontier{' --json' if '--json' in argv else ''}: {', '.join(masks)}")
    assert all(word in line for word in words) and ("added" in line) == (argv == ["--json", "r.json"])


@pytest.fixture
def bars():
    """A progress bar that records its total and every description it is given, and the records."""
    seen = []

    class Bar:
        def __init__(self, total, desc, **kwargs):
            seen.append([total, desc])

        def set_description(self, desc):
            seen[-1].append(desc)
        update = close = staticmethod(lambda *args: None)

    return Bar, seen


def test_vmem_sweep_counts_its_compiles_and_shows_each(capsys, monkeypatch, bars):
    import svg_lib.cli.vmem as vmem_command
    import svg_lib.instruments.tpu.checks as checks

    Bar, bars = bars
    monkeypatch.setattr(vmem_command, "has_libtpu", lambda: True)
    monkeypatch.setattr(checks, "progress_bar", Bar)
    monkeypatch.setattr(checks, "compile_check", lambda e, target: checks.CompilerCheck(
        e, target, e.vmem_limit_bytes or 0, e.fits, None, None, 0.0))
    code, out, err = run(capsys, "vmem", "--sweep", "--methods", "dense", "b3", "--targets", "v6e",
                         "--blocks", "512x512", "--dtypes", "bfloat16")
    assert code == 0
    assert err.strip() == "vmem --sweep: 2 kernels to compile for TPU on this CPU, one at a time; each result " \
                          "prints as it comes"
    assert bars == [[2, "vmem sweep", "vmem sweep: dense 512 x 512 bfloat16 on v6e",
                     "vmem sweep: b3 512 x 512 bfloat16 on v6e"]]
    assert out.count("512x512") == 2 and "2 points, 0 disagreements" in out


# -- --json [PATH] alike in every command: a file, or "-" (and --json alone) for stdout ----------

@pytest.fixture
def json_runs(monkeypatch):
    """Every command's run replaced by one that prints a table and a progress line, then its JSON, as
    the commands do: the plumbing every command shares, without the work."""
    import dataclasses

    import svg_lib.cli as cli
    from svg_lib.cli.common import emit_json, say, show

    def fake(name):
        def run_it(args):
            print("a line of the command's")
            show(args, "the table")
            say("a progress line")
            emit_json(args, {"command": name})
            return 0
        return run_it

    monkeypatch.setattr(cli, "COMMANDS", tuple(dataclasses.replace(c, run=fake(c.name)) for c in cli.COMMANDS))


COMMAND_NAMES = [c.name for c in commands()]
NEEDS = {"bench": ["--preset", "tiny"], "lower": ["--preset", "tiny"], "compile": ["--preset", "tiny"],
         "tune": ["--preset", "tiny"], "plan": ["--preset", "tiny"]}


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_every_command_takes_json_alike(command, capsys):
    code, out, _ = run(capsys, command, "--help")
    help_text = " ".join(out.split())
    assert code == 0 and "--json [PATH]" in help_text, command
    said = help_text[help_text.index("--json [PATH] "):]
    assert "a missing folder is created" in said and "- (or --json alone): the JSON alone on stdout" in said


@pytest.mark.parametrize("command", COMMAND_NAMES)
@pytest.mark.parametrize("stdout_flag", [["--json", "-"], ["--json"]])
def test_json_on_stdout_is_the_only_thing_there(json_runs, capsys, command, stdout_flag):
    code, out, err = run(capsys, command, *NEEDS.get(command, []), *stdout_flag)
    assert code == 0 and out.count("\n") == 1 and json.loads(out) == {"command": command}
    assert "the table" not in out + err  # the JSON takes the table's place
    assert "a line of the command's" in err and "a progress line" in err  # the rest moves to stderr
    code, out, err = run(capsys, command, *NEEDS.get(command, []), *stdout_flag, "--quiet")
    assert code == 0 and json.loads(out) == {"command": command} and "a progress line" not in err


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_json_to_a_file_keeps_the_table_on_stdout(json_runs, capsys, tmp_path, command):
    path = tmp_path / "new" / f"{command}.json"
    code, out, err = run(capsys, command, *NEEDS.get(command, []), "--json", str(path))
    assert code == 0 and out == "a line of the command's\nthe table\n"
    assert err == f"a progress line\nwrote {path}\n" and json.loads(path.read_text()) == {"command": command}
    code, out, err = run(capsys, command, *NEEDS.get(command, []))  # no --json: no JSON anywhere
    assert code == 0 and out == "a line of the command's\nthe table\n" and err == "a progress line\n"


def test_plan_json_in_a_file_or_on_stdout_is_plan_stats(capsys, tmp_path):
    stats = expected_stats(3, 8, 16, 0.35, 128, 128)
    code, out, err = run(capsys, "plan", "--preset", "tiny", "--json", "-")
    assert code == 0 and json.loads(out) == stats and err == ""
    path = tmp_path / "plan" / "stats.json"
    code, out, err = run(capsys, "plan", "--preset", "tiny", "--json", str(path))
    assert code == 0 and "B3 aligned" in out and err == f"wrote {path}\n"
    assert json.loads(path.read_text()) == stats


def test_cost_json_in_a_file_keeps_the_tables(without_libtpu, capsys, tmp_path):
    path = tmp_path / "cost.json"
    code, out, err = run(capsys, "cost", "--json", str(path))
    assert code == 0 and "cost model" in out and err.strip().endswith(f"wrote {path}")
    assert json.loads(path.read_text())["problem"]["tokens"] == 21 * 16 * 30  # the default preset, small
    code, out, _ = run(capsys, "cost", "--help")
    assert "(default small)" in " ".join(out.split())


def test_compile_lists_its_targets_as_json(capsys):
    from svg_lib.chips import TARGETS

    code, out, err = run(capsys, "compile", "--list-targets", "--json")
    assert code == 0 and err == "" and [t["name"] for t in json.loads(out)] == list(TARGETS)


def test_frontier_records_on_stdout(capsys, monkeypatch):
    monkeypatch.setattr("svg_lib.cli.frontier.run", lambda **kw: {"records": [{"mask": "radial"}]})
    code, out, err = run(capsys, "frontier", "--json", "-", "--masks", "radial")
    assert code == 0 and json.loads(out)["records"] == [{"mask": "radial"}] and out.count("\n") == 1
    assert err.startswith("frontier --json: radial")


# -- refusals: one line, what was wrong and what works, a non-zero exit -------------------------

@pytest.mark.parametrize("command", [c for c in COMMAND_NAMES if c not in ("frontier", "vmem")])
def test_every_preset_flag_refuses_an_unknown_one_in_one_line(nothing_runs, capsys, command):
    err = refused(capsys, command, "--preset", "huge")
    assert "argument --preset: invalid choice: 'huge'" in err and "tiny" in err and "blog" in err
    assert nothing_runs == []


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_a_json_path_that_is_a_folder_is_refused_in_one_line(nothing_runs, capsys, tmp_path, command):
    err = refused(capsys, command, *NEEDS.get(command, []), "--json", str(tmp_path))
    assert "is a folder; give a file name in it" in err and nothing_runs == []


def test_a_write_that_fails_after_the_checks_is_one_line(monkeypatch, capsys, tmp_path):
    import dataclasses

    import svg_lib.cli as cli

    def fail(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x.json"))

    monkeypatch.setattr(cli, "COMMANDS", tuple(dataclasses.replace(c, run=fail) for c in cli.COMMANDS))
    err = refused(capsys, "plan", "--preset", "tiny", "--json", str(tmp_path / "x.json"))
    assert err.strip() == f"python -m svg_lib plan: error: Permission denied: {tmp_path / 'x.json'}"


def test_report_creates_its_folder_through_the_shared_helper(monkeypatch, capsys, tmp_path):
    import svg_lib.cli.report as report_command

    made = []
    monkeypatch.setattr(report_command, "run_report",
                        lambda out, **kw: made.append(os.path.isdir(out)) or {"evidence": "simulated"})
    code, out, err = run(capsys, "report", "--out", str(tmp_path / "a" / "b"), "--json", "-", "--preset", "tiny")
    assert code == 0 and made == [True] and json.loads(out) == {"evidence": "simulated"}


def test_sharded_says_what_it_compiles_and_shows_each(monkeypatch, capsys, bars):
    import svg_lib.cli.sharded as sharded_command

    class Report:
        def __init__(self, permute):
            self.permute = permute

        def describe(self):
            return f"permute {self.permute}: compiled"

    Bar, bars = bars
    monkeypatch.setattr(sharded_command, "has_libtpu", lambda: True)
    monkeypatch.setattr(sharded_command, "bar", Bar)
    monkeypatch.setattr(sharded_command, "compile_sharded_layer", lambda mask, permute, **kw: Report(permute))
    code, out, err = run(capsys, "sharded", "--preset", "tiny", "--heads", "8", "--permute", "before", "after")
    assert code == 0 and out == "permute before: compiled\npermute after: compiled\n"
    assert err.startswith("sharded: 2 compile(s) of the b3 layer for v6e:2x4") and len(err.strip().splitlines()) == 1
    assert bars == [[2, "sharded", "sharded: permute before", "sharded: permute after"]]
    code, out, err = run(capsys, "sharded", "--preset", "tiny", "--permute", "before", "--quiet")
    assert code == 0 and err == ""
