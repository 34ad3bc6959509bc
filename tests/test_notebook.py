from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("DTG_NOTEBOOK_OUT", str(tmp_path / "sweep"))
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    result = [o for o in nb.cells[-1].outputs if o["output_type"] == "execute_result"]
    last = result[0]["data"]["text/plain"]
    assert "precision" in last and "roc_auc" in last
    assert (tmp_path / "sweep" / "sweep.json").is_file()
