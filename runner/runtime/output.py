"""The job's output folder (Hydra's run directory): where it is, its log file, and one warning line when it cannot
be written."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from runner.errors import one_line

log = logging.getLogger(__name__)


class OutputFolder:
    """What a run keeps in its folder: the MLflow journal and Hydra's log file (neither without Hydra: the working
    directory). A write there that fails (a full disk) is one warning, the first time; the store keeps every write."""

    def __init__(self, path: Path, log_file: Path | None):
        self.path, self.log_file = path, log_file
        self.warned = False

    @classmethod
    def current(cls) -> OutputFolder:
        """This job's folder: Hydra's output dir under @hydra.main, else the working directory."""
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return cls(Path.cwd(), None)
        hc = HydraConfig.get()
        folder = Path(hc.runtime.output_dir)
        return cls(folder, folder / f"{hc.job.name}.log")

    def failed(self, error: BaseException) -> None:
        """The journal or the log file could not be written there: say so once, naming the folder."""
        if not self.warned:
            self.warned = True
            log.warning("output folder %s cannot be written (%s): this run's journal and log file there are "
                        "incomplete from now on; the tracking store keeps every write", self.path, one_line(error))

    def watch_log(self) -> None:
        """Route a failed write of the job's log file to `failed` instead of logging's traceback on stderr."""
        for handler in logging.getLogger().handlers:
            ours = isinstance(handler, logging.FileHandler) and Path(handler.baseFilename) == self.log_file
            if ours and self.log_file:
                handler.handleError = lambda record: self.failed(sys.exc_info()[1] or OSError("write failed"))
