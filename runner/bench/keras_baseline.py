"""The baseline a user would reach for: plain Keras `model.fit`, alone or under MirroredStrategy.

    python -m runner.bench.keras_baseline --model mlp --variant default --gpus 1 --batch 128 --steps 600 [--mirrored]
        [--optimizer adamw|adam|sgd|...] (default: the model's own) [--override KEY=VALUE ...]

The same model, data, optimizer (Keras' own update), precision, global batch and host pipeline as the runner's
(its config composed with the same overrides); Keras' defaults otherwise. Fit runs `steps` steps as epochs of
`--chunk` steps; the rate is the mean ± standard error over the epochs after the first (tracing, warm-up). Prints one
JSON line: the rate in the data's unit, the job overhead (process start to the end of the first step), the peak RSS
and the optimizer used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import typing

from omegaconf import OmegaConf

from runner.data_pipelines import DATASETS
from runner.data_pipelines.split import Split
from runner.config import OptimizerName, compose, validate
from runner.errors import ConfigError, UserError, one_line


def main(argv: list[str] | None = None) -> int:
    """Run the baseline and print its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m runner.bench.keras_baseline")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--variant", default=None, help="the model's variant, if it has variants")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--mirrored", action="store_true")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--optimizer", default=None, choices=typing.get_args(OptimizerName),
                        help="default: the model's own, as the runner's")
    parser.add_argument("--data", default="mnist", choices=DATASETS.names())
    parser.add_argument("--override", action="append", default=[], help="a runner config override (repeatable)")
    args = parser.parse_args(argv)

    variant = [f"model.variant={args.variant}"] if args.variant else []
    try:  # the runner's config, so that an override (learning rate, precision, data) applies to both sides alike
        plan = validate(compose([f"model={args.model}", f"data={args.data}", f"train.global_batch_size={args.batch}",
                                 *([f"train.optimizer={args.optimizer}"] if args.optimizer else []), *variant,
                                 *args.override]))
        if plan.train.table_optimizer:
            raise ConfigError(f"train.table_optimizer={plan.train.table_optimizer}: Keras fit applies one optimizer "
                              "to every weight, so the baseline has no optimizer per part; compare with "
                              "train.table_optimizer=null")
        data = plan.data.load(0)  # before TensorFlow starts, as in a run
    except UserError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    batch = plan.train.global_batch_size

    import runner
    from runner.runtime import devices as devices_mod

    devices = devices_mod.setup(args.gpus)
    import keras
    import tensorflow as tf

    from runner.measure.hooks import peak_rss_mb
    from runner.strategies.common import build_model, build_optimizer
    from runner.train import Timer

    keras.mixed_precision.set_dtype_policy(plan.train.precision)
    with tf.distribute.MirroredStrategy(list(devices.names)).scope() if args.mirrored else tf.device(devices.names[0]):
        model = build_model(plan.model, plan.spec, 0, fused_batch_norm=False)  # Keras' own layers
        optimizer = build_optimizer(OmegaConf.merge(plan.train, {"fused_optimizer": False}), model.trainable_variables)
        optimizer.global_clipnorm = plan.train.clip_norm  # Keras clips the gradients it applies (None: not at all)
        model.compile(optimizer=optimizer, loss=plan.spec.task.loss)  # the runner's loss per example; Keras averages
    starts, epochs, first_step_end = [], [], []  # epochs' starts and seconds; the end of the first step (overhead)
    timer = keras.callbacks.LambdaCallback(  # one test per step: nothing beside a step
        on_epoch_begin=lambda epoch, logs=None: starts.append(time.perf_counter()),
        on_epoch_end=lambda epoch, logs=None: epochs.append(time.perf_counter() - starts[-1]),
        on_train_batch_end=lambda batch, logs=None: first_step_end or first_step_end.append(time.time()))
    split = Split()  # the runner's `split` feed with its default options, shuffling itself (fit's shuffle=False)
    model.fit(data.train().shuffled(split.shuffle_buffer, 0).batched(batch, split), steps_per_epoch=args.chunk,
              epochs=max(2, args.steps // args.chunk), verbose=0, callbacks=[timer], shuffle=False)
    timed = Timer(warmup_calls=1, steps_per_call=args.chunk)  # the runner's own summary of timed calls (epochs)
    for seconds in epochs:
        timed.add(args.chunk, seconds)
    print(json.dumps({
        **timed.summary(batch * plan.spec.units_per_example, plan.spec.unit), "devices": devices.count,
        "simulated": devices.simulated, "distributed": args.mirrored, "optimizer": type(model.optimizer).__name__,
        "clip_norm": model.optimizer.global_clipnorm,
        "seconds_to_first_step": first_step_end[0] - runner.STARTED_AT, "peak_rss_mb": peak_rss_mb(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
