"""The MLflow UI as a user opens it after a sweep, in a real browser (Debian's chromium and chromium-driver, driven by
selenium; `.ci/run` installs them): the link the runner prints opens the runs table (not MLflow 3's GenAI overview),
the sweep's parent with its children, images/s, test accuracy and the key the sweep varied for each child, and a
language model's run beside them with its tokens/s and time to its loss target, without configuring anything.
The screenshot is kept as a test artifact (`RUNNER_UI_SCREENSHOT=path` chooses where)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import cli_env, run_cli

pytestmark = pytest.mark.slow  # a 2-job sweep, an MLflow server and a browser: ~40 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1920,1000",
                 f"--user-data-dir={tempfile.mkdtemp()}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=options)
    yield driver
    driver.quit()


@pytest.fixture
def ui_server(tmp_path):
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    yield port
    os.killpg(server.pid, 9)
    server.wait()


def test_the_printed_link_opens_the_sweep_with_its_figures_in_a_real_browser(tmp_path, browser, request):
    from mlflow import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # two jobs of one combination told apart by the key the sweep varies (its column in the view)
    sweep = run_cli("-m", "debug=smoke", "train.steps=20", "strategy=mirrored", "gpus=2",
                    "train.precision=float32,mixed_bfloat16", cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    (printed,) = re.findall(r"then open (\S+)", sweep.stdout + sweep.stderr)
    port = request.getfixturevalue("ui_server")
    url = printed.replace("127.0.0.1:5000", f"127.0.0.1:{port}")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2
    language = _language_models_run(f"sqlite:///{tmp_path / 'mlflow.db'}")

    _wait_for_server(port)
    browser.get(f"http://127.0.0.1:{port}/health")
    browser.execute_script("localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
                           "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")
    browser.get(url)
    rows = ".ag-center-cols-container .ag-row"
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, rows))
    assert "/runs" in browser.current_url and "overview" not in browser.current_url  # the runs table, not GenAI
    headers = [h.get_attribute("col-id") for h in browser.find_elements(By.CSS_SELECTOR, ".ag-header-cell")]
    for column in ("metrics.`images_per_sec`", "metrics.`test_accuracy`", "metrics.`tokens_per_sec`",
                   "metrics.`time_to_loss_seconds`", "tags.`strategy`", "params.`train.precision`"):
        assert column in headers, headers
    gpt = browser.find_element(By.CSS_SELECTOR, f"{rows}[row-id='{language}']")
    for column, value in (("tokens_per_sec", 12345.0), ("time_to_loss_seconds", 6.5)):  # its own unit and target
        assert float(gpt.find_element(By.CSS_SELECTOR, f".ag-cell[col-id='metrics.`{column}`']").text) == value
    pinned = f".ag-pinned-left-cols-container .ag-row[row-id='{parent.info.run_id}']"
    browser.find_element(By.CSS_SELECTOR, f"{pinned} button[data-component-id*='runnamecellrenderer']").click()
    WebDriverWait(browser, 20).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) >= 4)
    for child in children:
        row = browser.find_element(By.CSS_SELECTOR, f"{rows}[row-id='{child.info.run_id}']")

        def cell(column: str) -> str:
            return row.find_element(By.CSS_SELECTOR, f".ag-cell[col-id='{column}']").text

        assert float(cell("metrics.`images_per_sec`")) == pytest.approx(child.data.metrics["images_per_sec"],
                                                                         rel=1e-3)
        assert float(cell("metrics.`test_accuracy`")) == pytest.approx(child.data.metrics["test_accuracy"], rel=1e-3)
        assert cell("tags.`strategy`") == child.data.tags["strategy"]
        assert cell("params.`train.precision`") == child.data.params["train.precision"]
    assert {c.data.params["train.precision"] for c in children} == {"float32", "mixed_bfloat16"}
    time.sleep(1)  # cells settle before the picture
    shot = Path(os.environ.get("RUNNER_UI_SCREENSHOT", tmp_path / "runs_view.png"))
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def _language_models_run(uri: str) -> str:
    """A language model's run beside the sweep, its figures logged as a run logs them (without training): the view
    gains its columns (tokens/s, validation loss, time to a loss) as the run starts."""
    from conftest import compose

    from runner.config import validate
    from runner.tracking import tracked

    plan = validate(compose("debug=smoke", "model=gpt", "data=synthetic", "data.task=next_token",
                            "data.vocabulary_size=50", "data.sequence_length=16", "train.target_loss=3.5",
                            f"mlflow.tracking_uri={uri}"))
    with tracked(uri, plan) as run:
        run.metrics({"tokens_per_sec": 12345.0, "test_accuracy": 0.25, "test_loss": 3.4, "time_to_loss_seconds": 6.5},
                    20)
    return run.run_id


def _wait_for_server(port: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("the MLflow UI did not start")
