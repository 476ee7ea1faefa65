"""`python -m svg_lib report` on the CPU path: the page a TPU reader runs, here in interpret mode."""
import json

from svg_lib.cli import main
from svg_lib.problem import PRESETS
from svg_lib.instruments.tools.report import METHODS, modelled_cycles


def test_report_runs_every_step_and_writes_its_page(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "--preset", "tiny", "--repeats", "1", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.png"}
    data = json.loads((out / "report.json").read_text())
    assert data["mode"] == "interpret" and data["runtime"]["compiled"] is False
    rows = data["bench"]["rows"]
    assert [r["method"] for r in rows] == list(METHODS)
    assert all(r["max_error"] is not None and r["max_error"] < 1e-3 for r in rows)  # tiny is float32
    # the adversarial inputs: every (method, head_dim, dtype) finite and within the dtype's tolerance
    assert len(data["adversarial"]) == 12
    assert all(r["finite"] and r["within_tolerance"] for r in data["adversarial"]), data["adversarial"]
    for inputs in ("random", "planted"):
        for method, rates in data["pass_rates"][inputs].items():
            assert len(rates) == 2 if inputs == "random" else 3
            assert all(0.0 <= r <= 1.0 for r in rates), (inputs, method)
    # off a TPU nothing is calibrated: the model's blog prediction is shown instead, and the page says so
    assert data["model"] is None and data["ns_per_simulated_cycle"] is None
    assert set(data["model_for_blog_v6e"]["cycles"]) == set(METHODS)
    page = (out / "report.md").read_text()
    assert "interpret mode" in page and "simulated, not measured" in page
    assert "wrote" in capsys.readouterr().out


def test_the_model_beside_a_tpu_run_comes_from_the_committed_reference():
    blog = PRESETS["blog"]
    v6e = modelled_cycles(blog, "v6e")
    cycles = v6e["cycles"]
    assert cycles["b3"] < cycles["b2"] < cycles["splash_dense"]
    assert not v6e["b0_lower_bound"]          # Splash's block-mask body is simulated on a v6e
    assert modelled_cycles(blog, "v5e")["b0_lower_bound"]  # not on a v5e: B0 at its mask-free body
    assert modelled_cycles(blog, "v4") is None and modelled_cycles(PRESETS["tiny"], "v6e") is None
