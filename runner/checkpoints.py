"""Periodic checkpoints of a run, and resuming a killed run from the last one.

What is saved, every `train.checkpoint_every` steps (at the end of the call that crosses the mark): every variable
the strategy owns, the training step, and the run's training time with its target's crossing (`train.Elapsed`). The
data position is not saved: the pipelines are deterministic for a seed, so a resumed run fast-forwards its feed by
the restored steps and sees exactly the batches the uninterrupted run would have.

Where: a folder per config hash (`directory`), so a restarted job finds them by what it computes, not by Hydra's
output folder. A run that finishes deletes them; one that fails or is killed keeps them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from runner.errors import UserError, one_line
from runner.lazy import tf
from runner.paths import locked, write_json
from runner.tracking.stale import process_alive
from runner.tracking.tags import process_tags
from runner.train import Elapsed, Hook, crossed


log = logging.getLogger(__name__)
logging.getLogger("absl").setLevel(logging.WARNING)  # the checkpoint writer logs an INFO line per save
RUN_FILE = "run.json"  # beside the checkpoints: which MLflow run wrote them, at which step, on which data
WRITER_FILE = "writer.json"  # beside them: the MLflow run that writes the folder now and its process (`claim`)
LOCK_FILE = ".claim.lock"  # held while a start reads and takes the folder, so two at once cannot both take it


class CheckpointError(UserError):
    """A checkpoint cannot be written; the message says where and what to do."""


class CheckpointInUse(CheckpointError):
    """A live run of the same config writes the checkpoint folder; the message names it and what to do."""


def _read_json(path: Path) -> dict:
    """A small JSON file beside the checkpoints; missing or unreadable: empty."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}  # valid JSON of another shape: as unreadable


def claim(folder: Path, run_id: str) -> None:
    """Make run `run_id` (this process's) the writer of the checkpoint folder `folder` (created if missing), unless
    the process of another run that writes it is alive on this host: then raise CheckpointInUse."""
    try:
        with locked(folder / LOCK_FILE):
            writer = _read_json(folder / WRITER_FILE)
            mine = process_tags().items() <= writer.items()  # an earlier run of this process: ended (one at a time)
            if writer.get("run_id", run_id) != run_id and not mine and process_alive(writer):
                pid = writer["runner.pid"]
                raise CheckpointInUse(
                    f"run {writer['run_id']} of this config is still training on this host (pid {pid}) and writes its "
                    f"checkpoints to {folder}; wait for it to end or stop it (kill {pid}), or give this start its "
                    "own train.checkpoint_dir (train.checkpoint_every=0: no checkpoints)"
                )
            write_json(folder / WRITER_FILE, {"run_id": run_id, **process_tags()})
    except OSError:  # a full disk: the run's first save there fails it in one line, with its metrics kept
        return


def release(folder: Path) -> None:
    """Give up the checkpoint folder `folder` if this process holds it (`claim`): its run has ended, however it ended
    (a long-lived process, a notebook's, starts other runs or none)."""
    if not (folder / WRITER_FILE).exists():  # not claimed, or removed with the finished run's checkpoints
        return
    with contextlib.suppress(OSError), locked(folder / LOCK_FILE):
        if process_tags().items() <= _read_json(folder / WRITER_FILE).items():
            (folder / WRITER_FILE).unlink()


def unreadable(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be read whole (every saved tensor), or None."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as e:  # noqa: BLE001 - any failure to read it means "damaged"
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    return None


class Checkpointer(Hook):
    """Saves and restores one run's training state (the strategy's `objects`) in `directory`; as a training-loop
    hook, every `every` steps but not after the last call. `run_id` is recorded beside the checkpoints (a resumed
    run links to it). On a multi-worker job only the chief is the `writer`; the others save to `scratch` and delete
    it (saving mirrored variables is a collective step). `data`: the digest of the training examples (the MLflow
    dataset record's), saved beside them: a resume on other data is refused."""

    def __init__(self, directory: Path, every: int, objects: dict[str, Any], run_id: str | None, writer: bool = True,
                 scratch: Path | None = None, data: str = ""):
        self.directory, self.every, self.run_id, self.writer, self.data = directory, every, run_id, writer, data
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="checkpoint_step")
        self.timing = {  # the run's `Elapsed` as of the step (`save`, `_restore`)
            "elapsed_seconds": tf.Variable(0.0, dtype=tf.float64, trainable=False, name="elapsed_seconds"),
            "reached_step": tf.Variable(-1, dtype=tf.int64, trainable=False, name="reached_step"),
            "reached_seconds": tf.Variable(math.nan, dtype=tf.float64, trainable=False, name="reached_seconds"),
        }
        self.checkpoint = tf.train.Checkpoint(step=self.step, **self.timing, **objects)  # what is saved
        self.state = tf.train.Checkpoint(step=self.step, **objects)  # all but the timing: an older runner's save
        self.elapsed = Elapsed()  # the training loop's own once it starts (`start`)
        self.restored = Elapsed()  # what the restored checkpoint held
        target = directory if writer else (scratch or directory / ".scratch")
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(target), max_to_keep=2)

    def restore(self) -> tuple[int, str | None]:
        """Load the newest intact checkpoint, if any: (its step, the MLflow run that wrote it), else (0, None). Each
        is read whole first, so a damaged one is reported and skipped without touching the variables."""
        state = tf.train.get_checkpoint_state(str(self.directory))  # every worker reads the chief's folder
        candidates = list(reversed(state.all_model_checkpoint_paths)) if state else []
        written_on = _read_json(self.directory / RUN_FILE).get("data", self.data)  # an older runner's: unknown
        if candidates and written_on != self.data:
            raise CheckpointError(
                f"the checkpoints in {self.directory} were written training on other data (its digest {written_on}, "
                f"this data's {self.data}): the data changed since they were saved; remove that folder to train from "
                "step 0 on this data, or train on the data they were written with"
            )
        for path in candidates:
            damage = unreadable(path)
            if damage:
                log.warning("checkpoint %s is damaged (%s); trying an older one", path, damage)
                continue
            try:
                self.restored = self._restore(path)
            except (AssertionError, ValueError) as e:
                raise CheckpointError(
                    f"checkpoint {path} does not fit this run's variables (written by another strategy, model, device "
                    f"count or runner version: {(str(e).splitlines() or [''])[0][:200]}); remove it or set "
                    "train.checkpoint_dir elsewhere"
                ) from None
            step = int(self.step.numpy())
            log.info("resuming from checkpoint %s at step %d", path, step)
            return step, _read_json(self.directory / RUN_FILE).get("run_id")
        if candidates:
            log.warning("no intact checkpoint in %s: training starts from step 0", self.directory)
        return 0, None

    def _restore(self, path: str) -> Elapsed:
        """Restore the training state from `path` and return the run's `Elapsed` saved with it (unknown, saying why,
        where it was not saved). Raises AssertionError or ValueError where the checkpoint does not fit."""
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except AssertionError:
            self.state.restore(path).assert_existing_objects_matched()  # raises again where more than timing lacks
            return Elapsed(unknown=f"checkpoint {path} holds no training time of the run's earlier part (saved by "
                                   "an older runner)")
        earlier = float(self.timing["elapsed_seconds"].numpy())
        step, seconds = int(self.timing["reached_step"].numpy()), float(self.timing["reached_seconds"].numpy())
        unknown = "" if not math.isnan(earlier) else \
            f"checkpoint {path} was saved by a part of the run that resumed from one without its training time"
        return Elapsed(earlier=0.0 if unknown else earlier, reached=(step, seconds) if step >= 0 else None,
                       unknown=unknown)

    def start(self, elapsed: Elapsed) -> None:
        """The loop's `elapsed` continues from the restored one (its parts' seconds, its target's crossing, what is
        not known), and is saved with every checkpoint."""
        saved = self.restored
        elapsed.earlier, elapsed.reached, elapsed.unknown = saved.earlier, saved.reached, saved.unknown
        self.elapsed = elapsed

    def save(self, step: int) -> None:
        """Save the training state as of `step` (all workers of a multi-worker job must call this together)."""
        self.step.assign(step)
        reached_step, reached_seconds = self.elapsed.reached or (-1, math.nan)
        self.timing["elapsed_seconds"].assign(self.elapsed.seconds)
        self.timing["reached_step"].assign(reached_step)
        self.timing["reached_seconds"].assign(reached_seconds)
        try:
            path = self.manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as e:
            raise CheckpointError(
                f"the checkpoint at step {step} could not be written to {self.manager.directory} ({one_line(e)}); free "
                "space there or set train.checkpoint_dir elsewhere (train.checkpoint_every=0: no checkpoints)"
            ) from None
        if self.writer:
            write_json(self.directory / RUN_FILE, {"run_id": self.run_id, "step": step, "data": self.data})
            log.info("checkpoint at step %d: %s", step, path)
        else:
            shutil.rmtree(self.manager.directory, ignore_errors=True)

    def after(self, step: int, n: int, seconds: float, last: bool) -> None:
        if not last and crossed(step, n, self.every):
            self.save(step)

    def stopped(self, step: int) -> None:
        if self.step.numpy() != step:  # not saved by `after` at this very step
            self.save(step)

    def finished(self) -> None:
        """The run completed: its checkpoints are no longer needed to resume it (nor is an empty parent folder)."""
        if self.writer:
            shutil.rmtree(self.directory, ignore_errors=True)
            if self.directory.exists():  # a read-only or failing disk: a start again would take them as unfinished
                log.warning("the finished run's checkpoints in %s could not be deleted: a start of this config would "
                            "resume from them as from an unfinished run; delete that folder", self.directory)
            with contextlib.suppress(OSError):  # other configs' checkpoints still in it: keep it
                self.directory.parent.rmdir()


def directory(checkpoint_dir: str, config_hash: str) -> Path:
    """A config's checkpoint folder: <train.checkpoint_dir>/<config hash>, relative to the launch directory."""
    return (Path(checkpoint_dir) / config_hash).resolve()
