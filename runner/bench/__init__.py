"""Benchmarks: every measurement in a fresh process; runner jobs are normal runs, read back from MLflow.

    python -m runner.bench grid [--models mlp,cnn,nin] [--variants tiny,default] [--gpus 1,2,4,8]
        [--strategies mirrored,replicated,parameter_server,single] [--pipelines split,per_tower,sharded]
        [--steps N --steps-per-call K] [--data mnist|synthetic] [--optimizer adam|sgd|momentum|rmsprop]
        [--repeats R] [--out FILE]

runs, for each model/variant, the runner's single device (before and after the grid), plain Keras `fit` on one
device, then for each device count Keras `fit` under MirroredStrategy and every strategy x pipeline (`single` on
1 device only), and prints one table per model/variant: images/s ± standard error over the timed steps, as ratios
to the runner's single-device rate and to Keras fit, the step time over its floor (the step's unavoidable work on
this device, runner/measure/floor.py: the limit is 1.0) beside MFU, the optimizer state per device, the pipeline-alone rate
against the step rate, peak RSS and job overhead (process start to first step); then a summary of the targets of the issue, PASS or FAIL in this run.
With --repeats R every job runs R times, in R rounds over all the jobs, and each row shows the median images/s
and its range (a single run of a millisecond-step job can be a quarter off on a shared host).

    python -m runner.bench strategies [--gpus 2,4] [--model mlp --variant default] [--steps 600]

is the same table for one model on 2 and 4 devices with the data-parallel strategies.

    python -m runner.bench floors [--models mlp,cnn,nin,lenet] [--rounds 3] [--optimizer adam]

runs, in each of R rounds, every built-in model on the runner's single device and in Keras fit (fresh processes)
and prints one row per model: medians over the rounds of images/s, runner / Keras (each round's pair), step time,
the floor's parts, step / floor, MFU and the probed peak; then whether each model's step is within 1.15x its floor,
the runner at least as fast as Keras (the MLP: 1.5x), and MFU at most 100% in every run.

    python -m runner.bench settings [--groups calls,fused,xla,precision,threads,reduce] [--steps N]

measures each speed setting users expect (steps per compiled call, fused optimizer updates, XLA, mixed
precision, host threads, mirrored's cross-device reduction and input feed, freed memory kept for reuse): one row
per value, each a fresh job, as a ratio to the first row of its group (the default), which is measured again at
the end of the group to show the noise.

    python -m runner.bench pipelines [--gpus 1,2,4] [--strategies replicated,mirrored] [--model mlp] [--steps 400]

prints, for each pipeline x strategy x device count, the batches/s of the input pipeline alone and of the full
training step, their ratio, and whether the run is input-bound (pipeline under 3x the step rate).

    python -m runner.bench predicted [--experiment bench_strategies] [--recalibrate]

predicts every finished runner run of an experiment (a bench grid's or a sweep's) from its own command line with the
cost model (runner/predict/) and prints predicted beside measured, with the accuracy line per model and devices.
    python -m runner.bench peers --peer DIR [--towers 1,2] [--rounds 3] [--batch 64] [--steps 200]

runs a user's ResNet-20 (runner/bench/user_resnet.py, brought with `_target_`) against tf_cnn_benchmarks' resnet20
from a checkout of github.com/tensorflow/benchmarks (runner/bench/peers.py): the runner with XLA off and on, the peer
with --xla off and on, per tower count, in rounds; the ratio is the runner's default over the faster peer.
    python -m runner.bench peers --gpt --nanogpt DIR --python VENV/bin/python [--rounds 2] [--iters 2000]

runs the runner's GPT against nanoGPT (runner/bench/nanogpt.py) on the runner's Shakespeare, nanoGPT with
--compile=False and True: tokens/s and validation loss on the same windows per round, the ratio over the faster.
Runner jobs land in the MLflow experiment `bench_<command>` with their config and devices.
"""
