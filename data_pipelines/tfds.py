"""Dataset `tfds`: a TensorFlow Datasets dataset already prepared in a local folder, never downloaded at run time.

`data.dataset` names it as TFDS does (`cifar10`, `imagenette/320px`, `mnist:3.0.1`); `data.data_dir` is the folder
it was prepared in (`tfds build NAME --data_dir DIR` where the internet is, then copy DIR). The spec comes from the
prepared dataset's own description (features.json, dataset_info.json) without TensorFlow; the TFRecord files are
read by the runner's record reader (sharded by file across towers) and decoded by TFDS's own features.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from runner.data_pipelines import DATASETS, IMAGE_SHAPE_OR_NULL, DataError, DatasetOptions, Spec
from runner.registry import Rule

PREPARE = "prepare it where the internet is (`tfds build {name} --data_dir DIR`) and copy DIR here"


def default_data_dir() -> str:
    """Where TFDS itself prepares datasets: $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    return os.environ.get("TFDS_DATA_DIR") or str(Path("~/tensorflow_datasets").expanduser())


@DATASETS.register
@dataclass
class TFDS(DatasetOptions):
    """A TensorFlow Datasets dataset prepared in data_dir: image and label features, train and test splits."""

    name: str = "tfds"
    dataset: str = "mnist"  # NAME[/CONFIG][:VERSION] as TFDS names it; no version: the newest prepared
    data_dir: str | None = None  # null: $TFDS_DATA_DIR, else ~/tensorflow_datasets
    train_split: str = "train"
    test_split: str = "test"
    image_key: str = "image"
    label_key: str = "label"
    shape: list[int] | None = None  # [height, width, channels] to resize to; null: the dataset's own fixed shape

    RULES: ClassVar[dict[str, Rule]] = {**DatasetOptions.RULES, "shape": IMAGE_SHAPE_OR_NULL}

    def describe(self) -> str:
        return f"TFDS {self.dataset} prepared in {self._folder()}"

    def _folder(self) -> Path:
        """The prepared dataset's version folder, holding dataset_info.json."""
        name, _, version = self.dataset.partition(":")
        where = self.data_dir or default_data_dir()
        root = Path(where).expanduser() / name
        candidates = [root / version] if version else sorted(
            root.glob("*.*.*"), key=lambda path: tuple(int(p) if p.isdigit() else -1 for p in path.name.split(".")))
        prepared = [c for c in candidates if (c / "dataset_info.json").is_file()]
        if not prepared:
            raise DataError(f"data.dataset={self.dataset} is not prepared in data.data_dir={where} (no "
                            f"{name}/{version or '<version>'}/dataset_info.json there); the runner never downloads: "
                            + PREPARE.format(name=name))
        return prepared[-1]

    def _description(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """dataset_info.json (splits, files) and features.json (the features' types and shapes)."""
        folder = self._folder()
        info = self._json(folder / "dataset_info.json")
        features_file = folder / "features.json"
        if not features_file.is_file() and "features" not in info:  # older TFDS versions kept them in the info
            raise DataError(f"{features_file} is not there; the prepared {self.dataset} is incomplete: "
                            + PREPARE.format(name=self.dataset.partition(":")[0]))
        features = self._json(features_file) if features_file.is_file() else info["features"]
        return info, features.get("featuresDict", {}).get("features", {})

    def _json(self, path: Path) -> dict[str, Any]:
        """A description file TFDS wrote, or a DataError naming it when it is not JSON (truncated, overwritten)."""
        try:
            found = json.loads(path.read_text())
            if not isinstance(found, dict):  # valid JSON, but not the object TFDS writes (`[]`, `null`)
                raise ValueError(f"a JSON {type(found).__name__}, not an object")
            return found
        except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError, not an object
            raise DataError(f"{path} cannot be read as JSON ({e}); the prepared {self.dataset} is damaged: "
                            + PREPARE.format(name=self.dataset.partition(":")[0])) from None

    def spec(self) -> Spec:
        """The image feature's shape and the label's number of classes, from the dataset's description; each split's
        record files checked to be there, framed as TFRecord files are and holding a record (records.check_framing);
        a description lacking a field TFDS writes is a DataError naming it."""
        try:
            return self._spec()
        except (KeyError, TypeError, IndexError) as e:  # a field missing, or not what TFDS writes
            raise DataError(f"data.dataset={self.dataset}'s description in {self._folder()} (dataset_info.json, "
                            f"features.json) lacks or garbles {e}; "
                            + PREPARE.format(name=self.dataset.partition(":")[0])) from None

    def _spec(self) -> Spec:
        from runner.data_pipelines.records import check_framing

        info, features = self._description()
        for split in (self.train_split, self.test_split):
            files = self._files(info, split)
            if missing := [f for f in files if not os.path.isfile(f)]:
                raise DataError(f"data.dataset={self.dataset} lacks {len(missing)} of the {len(files)} record files of "
                                f"its {split!r} split ({missing[0]} is not there); copy the whole prepared folder, or "
                                + PREPARE.format(name=self.dataset.partition(":")[0]))
            if not check_framing(files):  # an empty split ends training, or the final evaluation, in an error
                raise DataError(f"data.dataset={self.dataset}'s {split!r} split holds no records; each split needs "
                                "at least one")
        image, label = features.get(self.image_key, {}), features.get(self.label_key, {})
        if "image" not in image or "classLabel" not in label:
            raise DataError(f"data.dataset={self.dataset} has no image feature {self.image_key!r} and class label "
                            f"{self.label_key!r} (its features: {', '.join(features)}); set data.image_key and "
                            "data.label_key")
        dims = [int(d) for d in image["image"]["shape"]["dimensions"]]
        shape = tuple(self.shape) if self.shape else tuple(dims)
        if any(d <= 0 for d in shape):
            raise DataError(f"data.dataset={self.dataset}'s images have no fixed size ({dims}); set "
                            "data.shape=[height,width,channels] to resize them to")
        if shape[2] != dims[2]:
            raise DataError(f"data.shape={list(shape)} has {shape[2]} channels, {self.dataset}'s images {dims[2]}")
        return Spec(shape, int(label["classLabel"]["numClasses"]))

    def _files(self, info: dict[str, Any], split: str) -> tuple[str, ...]:
        """The split's TFRecord files, as TFDS named them."""
        if info.get("fileFormat", "tfrecord") != "tfrecord":
            raise DataError(f"data.dataset={self.dataset} is stored as {info['fileFormat']}; data=tfds reads "
                            "tfrecord files (tfds build --file_format=tfrecord)")
        splits = {s["name"]: s for s in info.get("splits", [])}
        if split not in splits:
            raise DataError(f"data.dataset={self.dataset} has no split {split!r}; it has {', '.join(splits)}")
        n, base = len(splits[split]["shardLengths"]), info["name"]
        return tuple(str(self._folder() / f"{base}-{split}.tfrecord-{i:05d}-of-{n:05d}") for i in range(n))

    def train_examples(self) -> int:
        info, _ = self._description()
        total = sum(int(n) for s in info["splits"] if s["name"] == self.train_split for n in s["shardLengths"])
        return min(total, self.train_limit) if self.train_limit else total

    def load(self, seed: int) -> Any:
        """The splits' files and TFDS's decoder; nothing is read, and TensorFlow is not imported, until training."""
        import importlib.util

        from runner.data_pipelines.records import RecordData

        if importlib.util.find_spec("tensorflow_datasets") is None:
            raise DataError("data=tfds reads with tensorflow-datasets, which is not installed: "
                            "pip install 'tf-runner[tfds]'")
        info, _ = self._description()
        spec = self.spec()
        decode = partial(decoder, str(self._folder()), spec, self.image_key, self.label_key)
        return RecordData(self._files(info, self.train_split), self._files(info, self.test_split), spec, decode,
                          self.train_limit, self.test_limit)


def decoder(folder: str, spec: Spec, image_key: str, label_key: str):
    """A serialized TFDS example -> (image, label), decoded by the dataset's own TFDS features."""
    import tensorflow_datasets as tfds

    from runner.data_pipelines.records import checked

    features = tfds.builder_from_directory(folder).info.features

    def decode(record):
        example = features.deserialize_example(record)  # {image: uint8 (h, w, C), label: int64 (), ...}
        return checked(example[image_key], example[label_key], spec)

    return decode
