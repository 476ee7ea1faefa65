"""`python -m svg_lib report` on the CPU path: the page a TPU reader runs, here in interpret mode."""
import json
import re
from pathlib import Path

import svg_lib.instruments.tools.report as report_module
from svg_lib.cli import main
from svg_lib.environment import installed_version
from svg_lib.problem import BLOG_V6E_MS, PRESETS
from svg_lib.instruments.tools.report import METHODS, issues_url, modelled_cycles, stage_series

ROOT = Path(__file__).resolve().parents[1]


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
    # what a reader needs to reproduce it, and the plot beside the page
    p = data["provenance"]
    assert p["command"] == f"python -m svg_lib report --preset tiny --repeats 1 --out {out}"
    assert (p["jax"], p["jaxlib"], p["libtpu"]) == tuple(installed_version(n) for n in ("jax", "jaxlib", "libtpu"))
    assert p["svg_lib"] == installed_version("svg-lib") and p["device_kind"] == data["runtime"]["device_kind"]
    assert p["chip"] is None and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", p["date_utc"])
    assert p["git_commit"] is None or re.match(r"[0-9a-f]{40}", p["git_commit"])
    assert "![Time per stage, measured and simulated, one axis per chip](report.png)" in page
    assert page.rstrip().splitlines()[-1] == (f"Send report.json, report.md and report.png to {issues_url()} "
                                              "(a new issue, template \"TPU report\").")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith(f"send all three to {issues_url()}") and "wrote" in last


def test_the_model_beside_a_tpu_run_comes_from_the_committed_reference():
    blog = PRESETS["blog"]
    v6e = modelled_cycles(blog, "v6e")
    cycles = v6e["cycles"]
    assert cycles["b3"] < cycles["b2"] < cycles["splash_dense"]
    assert not v6e["b0_lower_bound"]          # Splash's block-mask body is simulated on a v6e
    assert modelled_cycles(blog, "v5e")["b0_lower_bound"]  # not on a v5e: B0 at its mask-free body
    assert modelled_cycles(blog, "v4") is None and modelled_cycles(PRESETS["tiny"], "v6e") is None


def _data(platform, kind, mode, model_target=None, config=PRESETS["blog"]):
    ms = {"splash_dense": 80.0, "b1": 90.0, "b2": 50.0, "b3": 30.0}
    model = modelled_cycles(PRESETS["blog"], model_target) if model_target else None
    return {"runtime": {"platform": platform, "device_kind": kind, "jax_version": "0.10.2"}, "mode": mode,
            "evidence": f"{mode} on {kind}", "config": config.to_json(),
            "bench": {"rows": [{"method": m, "median_ms": v} for m, v in ms.items()]}, "model": model,
            "model_for_blog_v6e": None if model else modelled_cycles(PRESETS["blog"], "v6e")}


def test_on_a_v6e_measured_simulated_and_the_case_study_share_one_axis():
    axes = stage_series(_data("tpu", "TPU v6 lite", "compiled", "v6e"))
    assert len(axes) == 1
    series = axes[0]["series"]
    assert list(series)[0] == "measured (compiled)" and series["measured (compiled)"] == [80.0, 90.0, 50.0, 30.0]
    simulated = next(v for k, v in series.items() if k.startswith("simulated"))
    cycles = modelled_cycles(PRESETS["blog"], "v6e")["cycles"]
    assert [round(s / simulated[0], 6) for s in simulated] == [round(cycles[m] / cycles["splash_dense"], 6)
                                                                for m in METHODS]
    assert series["case study (blog, measured on a v6e)"] == [BLOG_V6E_MS[m] for m in METHODS]


def test_on_a_v5e_the_case_study_is_not_drawn_and_off_tpu_the_v6e_gets_its_own_axis():
    axes = stage_series(_data("tpu", "TPU v5 lite", "compiled", "v5e"))
    assert len(axes) == 1 and not any(k.startswith("case study") for k in axes[0]["series"])
    assert any(k.startswith("simulated (static profile at an assumed 1.50 GHz)") for k in axes[0]["series"])
    cpu = stage_series(_data("cpu", "cpu", "interpret", config=PRESETS["walkthrough"]))
    assert len(cpu) == 2 and list(cpu[0]["series"]) == ["measured (interpret)"]
    assert cpu[1]["title"].startswith("TPU v6e, not this machine") and len(cpu[1]["series"]) == 2
    report_module.stage_figure(_data("cpu", "cpu", "interpret"))  # draws both axes


def test_where_to_send_it(tmp_path, monkeypatch):
    url = (ROOT / "REPOSITORY_URL").read_text().strip()
    expected = f"{url}/issues/new?template=tpu-report.md" if url.startswith("https://") else \
        "the repository's issues page"
    assert issues_url() == expected
    (tmp_path / "REPOSITORY_URL").write_text("https://github.com/someone/svg-tpu.git\n")
    monkeypatch.setattr(report_module, "PACKAGE", tmp_path / "svg_lib")
    assert issues_url() == "https://github.com/someone/svg-tpu/issues/new?template=tpu-report.md"
    template = (ROOT / ".github" / "ISSUE_TEMPLATE" / "tpu-report.md").read_text()
    assert template.startswith("---\nname: TPU report\n")
    assert all(f"`{name}`" in template for name in ("report.json", "report.md", "report.png"))
