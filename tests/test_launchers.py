"""Sweeps through Hydra's launcher plugins with our configs in conf/hydra/launcher/: a real sweep through submitit's
local executor (the code path of SLURM without a cluster), and the SLURM config down to the sbatch script it writes."""

from __future__ import annotations

import pickle

import pytest
from conftest import run_cli, runs

from runner.config import CONF_DIR

SLURM_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
LOCAL_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"


def _compose(*overrides: str):
    """The config with its `hydra` node, as a multirun's launcher sees it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.slow  # ~14 s; a sweep on joblib's launcher stays in the default run (test_sweep.py)
def test_submitit_local_sweep_runs_every_job_through_submitit(tmp_path):
    proc = run_cli("-m", "hydra/launcher=local", "model=mlp", "train.seed=0,1", "debug=smoke", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep: 2 jobs: 2 finished, 0 failed, 0 skipped" in proc.stderr
    assert "Submitit 'local' sweep output dir" in proc.stdout

    df = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke")
    parents = df[df["tags.sweep"] == "parent"]
    assert len(parents) == 1 and parents.iloc[0]["status"] == "FINISHED"
    assert "hydra/launcher=local" in parents.iloc[0]["tags.sweep.command"]
    children = df[df["tags.sweep"] != "parent"]
    assert len(children) == 2 and set(children["status"]) == {"FINISHED"}
    assert set(children["tags.mlflow.parentRunId"]) == {parents.iloc[0]["run_id"]}
    assert sorted(children["params.train.seed"]) == ["0", "1"]

    # submitit ran them: one folder per job under <sweep dir>/submitit/, named by the job id submitit gave it,
    # holding the job's log and the pickled JobReturn of our job function, which saw that same id as hydra.job.id.
    (sweep_dir,) = tmp_path.glob("multirun/*/*")
    results = sorted(sweep_dir.glob("submitit/*/*_0_result.pkl"))
    assert len(results) == 2
    statuses = []
    for path in results:
        job_id = path.parent.name
        assert "Job completed successfully" in (path.parent / f"{job_id}_0_log.out").read_text()
        outcome, job_return = pickle.loads(path.read_bytes())
        assert outcome == "success"
        assert str(job_return.hydra_cfg.hydra.job.id) == job_id
        statuses.append(job_return.return_value["status"])
    assert statuses == ["FINISHED", "FINISHED"]


def test_slurm_config_composes_onto_the_plugins_slurm_launcher():
    cfg = _compose("hydra/launcher=slurm", "gpus=2")
    launcher = cfg.hydra.launcher
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "slurm"
    assert launcher._target_ == SLURM_TARGET
    assert launcher.gpus_per_node == 2  # follows `gpus`
    assert (launcher.cpus_per_task, launcher.mem_gb, launcher.timeout_min) == (8, 16, 60)
    assert (launcher.array_parallelism, launcher.max_num_timeout, launcher.tasks_per_node) == (16, 2, 1)
    assert launcher.name == "runner"
    assert launcher.submitit_folder == f"{cfg.hydra.sweep.dir}/submitit/%j"


def test_local_config_composes_onto_the_plugins_local_launcher():
    launcher = _compose("hydra/launcher=local").hydra.launcher
    assert launcher._target_ == LOCAL_TARGET
    assert launcher.gpus_per_node is None and launcher.timeout_min == 60 and launcher.name == "runner"


@pytest.mark.parametrize("name,target", [("submitit_slurm", SLURM_TARGET), ("submitit_local", LOCAL_TARGET)])
def test_the_plugins_own_options_are_not_shadowed(name, target):
    launcher = _compose(f"hydra/launcher={name}").hydra.launcher
    assert launcher._target_ == target
    assert launcher.submitit_folder.endswith("/.submitit/%j")  # the plugin's default, not ours
    from omegaconf import OmegaConf

    assert OmegaConf.to_container(launcher)["name"] == "${hydra.job.name}"  # the plugin's own, not our "runner"


def test_slurm_launcher_writes_the_sbatch_flags_we_chose(tmp_path, monkeypatch):
    """Run the plugin's own launch() up to the point of submitting, and read the sbatch script it would submit."""
    import submitit
    from hydra.utils import instantiate
    from submitit.slurm.slurm import SlurmExecutor

    cfg = _compose("hydra/launcher=slurm", "gpus=2", "hydra.launcher.partition=gpu", f"hydra.sweep.dir={tmp_path}")
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # as if `srun` were installed
    seen = {}

    def map_array(self, fn, *iterables):
        seen["executor"], seen["n"] = self._executor, len(iterables[0])
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", map_array)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=lambda cfg: None, config=cfg)
    assert launcher.launch([["train.seed=0"], ["train.seed=1"]], initial_job_idx=0) == []

    executor = seen["executor"]
    executor.parameters["map_count"] = seen["n"]  # what submitit sets for a job array
    flags = {line for line in executor._make_submission_file_text("python -m x", "uid").splitlines()}
    for flag in ("--gpus-per-node=2", "--cpus-per-task=8", "--mem=16GB", "--time=60", "--array=0-1%2",
                 "--job-name=runner", "--partition=gpu", "--ntasks-per-node=1", "--nodes=1"):
        assert f"#SBATCH {flag}" in flags
    assert f"#SBATCH --output={tmp_path}/submitit/%A_%a/%A_%a_0_log.out" in flags
