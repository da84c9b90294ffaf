"""Safe for a team: a real authenticated MLflow server (`mlflow server --app-name basic-auth`, the `auth` extra) on
127.0.0.1 takes runs, sweeps and reports with credentials from the environment; wrong credentials are one line;
a secret written into the tracking URI leaves no trace in the store (searched byte for byte), the run's folder or
the terminal. (The multi-worker listening address is checked in test_multi_worker.py.)"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, run_cli

from runner.tracking.redact import redact

ADMIN, PASSWORD = "admin", "S3cret-" + secrets.token_hex(6)


def test_redact_masks_user_info_and_secret_query_parameters():
    assert redact("https://alice:pa%24s@mlflow.example.org:5000/x") == "https://***@mlflow.example.org:5000/x"
    assert redact("mlflow.tracking_uri=http://tok3n@h:1 and more") == "mlflow.tracking_uri=http://***@h:1 and more"
    assert redact("http://h/api?token=abc&x=1") == "http://h/api?token=***&x=1"
    assert redact("sqlite:////home/me/mlflow.db a@b.c") == "sqlite:////home/me/mlflow.db a@b.c"  # no URI user-info


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A basic-auth tracking server; yields (uri, its folder)."""
    folder = tmp_path_factory.mktemp("auth-server")
    (folder / "auth.ini").write_text(
        f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{folder / 'auth.db'}\n"
        f"admin_username = {ADMIN}\nauthorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "auth_cache_ttl_seconds = 60\n"
    )
    env = {**cli_env(), "MLFLOW_AUTH_CONFIG_PATH": str(folder / "auth.ini"), "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--backend-store-uri",
         f"sqlite:///{folder / 'store.db'}", "--artifacts-destination", str(folder / "artifacts"), "--host",
         "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "the auth server did not start"
            time.sleep(0.3)
    yield f"http://127.0.0.1:{port}", folder
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _runner(cwd: Path, *args: str, password: str | None = PASSWORD) -> subprocess.CompletedProcess:
    credentials = {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": password}
    return run_cli(*args, cwd=cwd, env=credentials if password else dict.fromkeys(credentials), timeout=600)


def _client(uri: str):
    from mlflow import MlflowClient

    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = ADMIN, PASSWORD
    return MlflowClient(uri)


@pytest.mark.slow  # a server, a run, a 2-job sweep and a report: ~60 s
def test_runs_sweeps_and_report_work_with_credentials_from_the_environment(server, tmp_path):
    uri, _ = server
    run = _runner(tmp_path, "debug=smoke", "train.steps=20", f"mlflow.tracking_uri={uri}", "mlflow.experiment=auth")
    assert run.returncode == 0, run.stderr[-2000:]
    sweep = _runner(tmp_path, "-m", "debug=smoke", "train.steps=20", "strategy=mirrored,replicated", "gpus=2",
                    f"mlflow.tracking_uri={uri}", "mlflow.experiment=auth")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    client = _client(uri)
    runs = client.search_runs([client.get_experiment_by_name("auth").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 4 and len(children) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    report = _runner(tmp_path, "report", "--tracking-uri", uri, "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-2000:]
    assert report.stdout.startswith("report: sweep") and "verdict: mlp/tiny" in report.stdout


@pytest.mark.slow  # starts the server (~10 s) if the module's other tests did not
@pytest.mark.parametrize("password", ["wrong-password", None], ids=["wrong", "missing"])
def test_wrong_or_missing_credentials_are_one_line_naming_the_server(server, tmp_path, password):
    uri, _ = server
    t0 = time.monotonic()
    proc = _runner(tmp_path, "debug=smoke", f"mlflow.tracking_uri={uri}", "mlflow.experiment=auth", password=password)
    assert proc.returncode == 2 and time.monotonic() - t0 < 30  # no retry storm: 401 is not retried
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: tracking server {uri} refused the credentials (HTTP 401: not authenticated); pass "
                      "them in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"]
    assert "Traceback" not in proc.stderr
    client = _client(uri)
    experiment = client.get_experiment_by_name("auth")
    if experiment is not None:
        assert "RUNNING" not in {r.info.status for r in client.search_runs([experiment.experiment_id])}


@pytest.mark.slow  # the server, one run: ~25 s
def test_a_secret_in_the_tracking_uri_leaves_no_trace_in_the_store_the_folder_or_the_terminal(server, tmp_path):
    uri, folder = server
    with_secret = uri.replace("http://", f"http://{ADMIN}:{PASSWORD}@")
    proc = _runner(tmp_path, "debug=smoke", "train.steps=20", f"mlflow.tracking_uri={with_secret}",
                   "mlflow.experiment=secret", password=None)
    assert proc.returncode == 0, redact(proc.stderr[-2000:])
    assert PASSWORD not in proc.stdout + proc.stderr
    client = _client(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("secret").experiment_id])
    assert run.data.params["mlflow.tracking_uri"] == uri.replace("http://", "http://***@")  # logged, masked
    secret = PASSWORD.encode()
    for path in [*folder.rglob("*"), *tmp_path.rglob("*")]:  # the store (database and artifacts) and the run folder
        if path.is_file() and path.name != "auth.ini":
            assert secret not in path.read_bytes(), f"the secret is in {path}"
