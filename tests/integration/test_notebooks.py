"""The notebooks run top to bottom on a small simulated dataset and draw what their titles say.

Each notebook's cell tagged ``parameters`` is replaced by this test's values (papermill style),
then the notebook runs in a real Jupyter kernel (nbclient, the ``python3`` kernel of this
interpreter). A cell appended at the end prints the titles of every figure the notebook kept, so
the test can check that each figure is the one its section promises, and counts the PNGs shown.
Set ``FORESHOCK_NOTEBOOK_PNGS=DIR`` to keep the PNGs for a look.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from foreshock.ingest.simulator import Simulator, load_profile, write_dataset

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
_TITLES_CELL = (
    "import json as _json\nfrom matplotlib.figure import Figure as _Figure\n"
    "print('FIGURE_TITLES=' + _json.dumps({_k: [_a.get_title() for _a in _v.axes] + [_v._suptitle.get_text() "
    "if _v._suptitle else ''] for _k, _v in dict(globals()).items() if isinstance(_v, _Figure)}))"
)


def run_notebook(name: str, parameters: dict) -> tuple[nbformat.NotebookNode, dict[str, list[str]]]:
    """Execute ``notebooks/<name>`` with ``parameters``; return it and the titles of its figures."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        assert not cell.get("outputs"), f"{name}: outputs must be stripped in git"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name}: exactly one cell must be tagged 'parameters'"
    tagged[0].source = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    nb.cells.append(nbformat.v4.new_code_cell(_TITLES_CELL))
    where = {"metadata": {"path": str(ROOT)}}
    client = NotebookClient(nb, timeout=240, kernel_name="python3", resources=where)
    client.execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("name") == "stdout")
    titles = json.loads(text.split("FIGURE_TITLES=", 1)[1])
    keep = os.environ.get("FORESHOCK_NOTEBOOK_PNGS")
    if keep:
        for i, png in enumerate(pngs(nb)):
            out = Path(keep) / f"{Path(name).stem}-{i:02d}.png"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(png))
    return nb, titles


def pngs(nb: nbformat.NotebookNode) -> list[str]:
    return [
        o["data"]["image/png"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """16 nodes x 2 days at a high failure rate: enough failures to train on, in a few seconds."""
    out = tmp_path_factory.mktemp("nb") / "data"
    profile = load_profile(ROOT / "datasets" / "profiles" / "llama3.toml")
    sim = Simulator(
        profile, nodes=16, duration_ms=2 * 86_400_000, interval_ms=60_000, seed=3, rate_multiplier=300.0
    )
    return write_dataset(sim, out)


def test_kernel_is_this_interpreter() -> None:
    """``python3`` resolves to this venv's interpreter (no `ipykernel install` needed)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    km = KernelManager(kernel_name="python3")
    assert km.format_kernel_cmd()[0] in (sys.executable, spec.argv[0])
    assert Path(km.format_kernel_cmd()[0]).resolve() == Path(sys.executable).resolve()


def test_failure_analysis(dataset: Path, tmp_path: Path) -> None:
    nb, titles = run_notebook("failure_analysis.ipynb", {"DATA_DIR": str(dataset), "WINDOW_HOURS": 6.0})
    assert len(pngs(nb)) == 4
    assert titles["fig_mix"][0] == "Failure mix by cause: observed vs profile"
    suptitle = titles["fig_foreshocks"][-1]
    assert suptitle.startswith("Foreshocks of node") and "beside healthy node" in suptitle
    assert any("<- this precursor" in t for t in titles["fig_foreshocks"])
    assert titles["fig_xids"][0] == "Xid codes by frequency and severity"
    assert titles["fig_gaps"][0] == "Time between failures (whole cluster)"


def test_goodput(tmp_path: Path) -> None:
    params = {
        "PROFILE": "llama3",
        "GPUS": [1024, 8192],
        "RECALLS": [0.0, 0.5, 1.0],
        "DAYS": 20.0,
        "OPERATING_RECALL": 0.5,
        "METRICS": None,
        "OUT": str(tmp_path),
    }
    nb, titles = run_notebook("goodput.ipynb", params)
    assert len(pngs(nb)) == 2
    assert titles["fig_size"][0] == "ETTR against cluster size"
    assert (tmp_path / "ettr_vs_recall.png").is_file()


def test_model_report(dataset: Path, tmp_path: Path) -> None:
    """The registered-model path: the report's plots come back from the MLflow run's artifacts."""
    from foreshock.models.train import train_from_dataset

    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    train_from_dataset(
        dataset,
        tmp_path / "train",
        tracking_uri=tracking_uri,
        cadence_ms=300_000,
        budget_per_1000_node_days=20.0,
    )
    params = {
        "DATA_DIR": str(dataset),
        "MODEL": "models:/foreshock-risk@champion",
        "TRACKING_URI": tracking_uri,
    }
    nb, titles = run_notebook("model_report.ipynb", params)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "model version 1," in printed
    assert titles["fig_causes"][0].startswith("Recall by failure cause")
    explained = [k for k in ("fig_caught", "fig_missed") if k in titles]
    assert explained, "neither a caught nor a missed failure was explained"
    for key in explained:
        kind = key.removeprefix("fig_").capitalize()
        assert titles[key][0].startswith(f"{kind}: node")
    assert len(pngs(nb)) == 5 + len(explained)  # four report plots + recall by cause + explanations
    oracle = [o["data"]["text/plain"] for o in nb.cells[-2].outputs if "text/plain" in o.get("data", {})]
    assert oracle and "intensity oracle" in oracle[0] and "caught_15_minutes_ahead" in oracle[0]


def test_fleet_reliability_matches_the_titan_study_and_the_trace() -> None:
    """The fleet notebook on the real Titan data and the real trace. Its figures are checked
    against the study's published tables (gc_summary_loc.csv, titan.service.txt); the paper's
    text is not in the reference material, so no figure of the paper itself is asserted."""
    nb, titles = run_notebook("fleet_reliability.ipynb", {
        "TITAN": "titan", "TITAN_SUMMARY": "titan-summary", "TITAN_SERVICE": "titan-service",
        "TRACE": "infinitehbd"})
    assert len(pngs(nb)) == 9
    assert titles["fig_batch"][0] == "Titan GPU survival by batch"
    assert titles["fig_cage"][0] == "Old-batch GPU survival by cage (0 = bottom of the cabinet)"
    assert titles["fig_hazard"][0].startswith("Titan GPU hazard ratio by location")
    assert titles["fig_mtbf"][0] == "Titan system MTBF per quarter (GPU failures)"
    assert titles["fig_repeat"][0].startswith("InfiniteHBD: another fault within W of a repair")
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    checks = json.loads(printed.split("FLEET_CHECKS=", 1)[1].splitlines()[0])

    for row in checks["counts"]:  # per cage, slot and node
        assert row["positions_layout"] - 1 <= row["positions"] <= row["positions_layout"], row
        assert row["gpus"] == row["study_gpus"], row
        assert abs(row["failed"] - row["study_failed"]) <= 4, row
    hazards = {(h["covariate"], h["level"]): h for h in checks["hazards"]}
    for h in hazards.values():  # the same model on the raw lives and on the study's table
        assert h["lower_study"] <= h["hazard_ratio"] <= h["upper_study"], h
        assert h["hazard_ratio"] == pytest.approx(h["hazard_ratio_study"], rel=0.02), h
    # up the airflow, each cage fails more than the one below it, by several times
    assert 3.0 < hazards[("cage", "1")]["upper"] and hazards[("cage", "1")]["lower"] > 3.0
    assert hazards[("cage", "2")]["lower"] > hazards[("cage", "1")]["upper"]
    quarters = checks["quarters"]
    assert len(quarters) == 24  # 2013-11-19 (first install) to 2019-08-01, in calendar quarters
    for q in quarters:  # GPU deaths per quarter: Foreshock's reading of the lives against the study's
        assert abs(q["failures_deaths"] - q["failures_deaths_study"]) <= 3, q
    worst = min(quarters, key=lambda q: q["system_mtbf_hours"])
    assert worst["period_end"].startswith("2017-01-01") and worst["system_mtbf_hours"] < 3.0
    repeat = {r["window"]: r for r in checks["repeat"]}
    assert repeat["1 days 00:00:00"]["p_refault"] == pytest.approx(0.224, abs=0.005)
    assert repeat["7 days 00:00:00"]["p_refault"] == pytest.approx(0.313, abs=0.005)
    assert repeat["7 days 00:00:00"]["base_rate"] < 0.03
