"""`runner predict hardware=NAME`: spec sheets as a config group, each strategy's exchange over the links counted by
hand, the roofline of a model's layers, the JSON form, one-line refusals, and the predictions against TensorFlow's
published 2017 tables (runner/bench/published/), which the predictor never reads."""

from __future__ import annotations

import builtins
import json
import pathlib

import pytest
from conftest import REPO, compose, markdown_rows, subcommand

from runner.bench import published
from runner.config import ConfigError, validate
from runner.predict import spec_sheet
from runner.predict.grid import predict_all
from runner.strategies import STRATEGIES, Exchange

RESNET50_ON_DGX1 = ["experiment=tf_cnn_resnet50", "hardware=dgx1_p100"]


@pytest.mark.parametrize("name, options, wanted", [
    # 4 devices, W = 1000 bytes, 1 node: a ring sends 2 (N - 1) / N W = 1500 bytes per device.
    ("single", {}, Exchange()),
    ("mirrored", {}, Exchange(link_bytes=1500, device_sums=1.5)),
    ("replicated", {}, Exchange(link_bytes=1500, device_sums=1.0)),
    ("sharded_update", {}, Exchange(link_bytes=1500, device_sums=1.0, device_update=0.25)),
    # On the CPU: each device sends W and reads W back; the host sums 4 gradients and updates once.
    ("parameter_server", {"ps_device": "cpu"}, Exchange(host_bytes=1000, device_update=0.0, host_update=1.0,
                                                        host_sums=4)),
    # On the first device: it receives the 3 others' gradients and sends them the weights.
    ("parameter_server", {"ps_device": "first_device"}, Exchange(link_bytes=3000, device_sums=4)),
])
def test_each_strategy_counts_what_it_moves_over_the_links(name, options, wanted):
    assert STRATEGIES.get(name)(**options).exchange(4, 1, 1000.0) == wanted


def test_multi_worker_adds_a_ring_of_the_nodes_over_the_network():
    # 8 devices on each of 4 nodes, W = 1000: 1750 bytes per device within a node, 2 (K - 1) / K W = 1500 per node
    # over the network, in 2 (K - 1) = 6 steps one after another.
    assert STRATEGIES.get("multi_worker")().exchange(8, 4, 1000.0) == Exchange(
        link_bytes=1750, network_bytes=1500, device_sums=1.0, messages=6)


def test_a_clusters_devices_split_evenly_over_its_nodes_as_a_multi_worker_run_has_them():
    """A multi-worker run has the same gpus= on every worker: 12 GPUs on nodes of 8 are 2 nodes of 6 and 9 are 3 of 3
    (were priced as a full node's ring of 8 and 8 + 1), and 65 over at most 9 nodes of 8, which no run can have, was
    priced instead of refused with the counts near it that split evenly."""
    from runner.strategies.multi_worker import MultiWorker

    rings, exchange = [], MultiWorker.exchange
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MultiWorker, "exchange", lambda self, *args: rings.append(args[:2]) or exchange(self, *args))
        found = predict_all([["experiment=tf_cnn_resnet50", "hardware=ec2_p2_8xlarge", "hardware.nodes=9",
                              "strategy=multi_worker", f"gpus={n}"] for n in (64, 65, 12, 9)])
        two = predict_all([["experiment=tf_cnn_resnet50", "hardware=ec2_p2_8xlarge", "hardware.nodes=2",
                            "strategy=multi_worker", "gpus=9"]])  # 3 nodes of 3 would split; 2 are all there are
    assert [r for r in rings if r != (1, 1)] == [(8, 8), (6, 2), (3, 3)]  # (one node's devices, nodes)
    assert [o.prediction is None for o in found] == [False, True, False, False]
    assert "gpus=65 is not allowed; expected a count that splits evenly over up to hardware.nodes=9 nodes of 8 " \
           "(every worker runs the same devices), e.g. 63 or 64" in found[1].error, found[1].error
    assert two[0].error.endswith("e.g. 8 or 10"), two[0].error


def test_a_layer_is_priced_by_the_slower_of_its_flops_and_its_bytes():
    """One compute layer, counted by hand on a made-up accelerator (1 TFLOP/s, 1 TB/s, no kernel cost)."""
    from runner.hardware import Accelerator

    chip = Accelerator(name="x", peak_flops=1e12, memory_bytes=1e9, memory_bandwidth=1e12, clock_hz=1e30)
    gemm = spec_sheet.Layer("compute", flops=2e9, bytes=4e6, algorithm="gemm")
    passes = spec_sheet.passes([gemm], 10, chip, "float32")
    rate = 1e12 * spec_sheet.FIT.algorithms["gemm"]
    assert passes.forward == pytest.approx(10 * 2e9 / rate)
    assert passes.backward == pytest.approx(2 * 10 * 2e9 / rate)  # input and weight gradients
    relu = spec_sheet.Layer("elementwise", flops=0.0, bytes=8e6)  # memory-bound: bytes at MEMORY of 1 TB/s
    assert spec_sheet.passes([relu], 10, chip, "float32").forward == pytest.approx(
        10 * 8e6 / (1e12 * spec_sheet.FIT.memory))


def test_fast_algorithms_and_gemm_are_told_apart_by_the_convolutions_shape():
    import keras

    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, padding="same"),
                              keras.layers.Conv2D(8, 1), keras.layers.Conv2D(8, 3, strides=2),
                              keras.layers.Conv2D(8, 5), keras.layers.Flatten(), keras.layers.Dense(10)])
    found = [layer.algorithm for layer in spec_sheet.layers(model) if layer.kind == "compute"]
    assert found == ["fast", "gemm", "implicit", "fast", "gemm"]  # Winograd 3x3, FFT 5x5: one class
    assert spec_sheet.layers(model)[0].first and not spec_sheet.layers(model)[2].first


def test_depthwise_separable_and_recurrent_layers_are_priced_by_their_work_and_others_not_at_all():
    """Layers without a FLOP formula were priced as one multiply per weight: an LSTM of 64 steps came out at 124
    TFLOP/s of a 15.7 TFLOP/s V100, and Xception (separable convolutions) faster than InceptionV3. Now each is
    counted at every position and step it runs (checked by hand), a per-channel convolution is never Winograd's, and a
    layer with weights and no formula is a row that says so, not a price."""
    import keras

    from runner.errors import UserError
    from runner.measure.flops import forward_flops_per_example

    image, steps = keras.Input((32, 32, 8)), keras.Input((64, 20))
    for layer, source, flops in [
        (keras.layers.DepthwiseConv2D(3, padding="same"), image, 2 * 3 * 3 * 8 * 32 * 32),
        (keras.layers.SeparableConv2D(16, 3, padding="same"), image, 2 * (3 * 3 * 8 + 8 * 16) * 32 * 32),
        (keras.layers.LSTM(32), steps, 2 * (20 * 4 * 32 + 32 * 4 * 32) * 64),  # 4 gates, at each of 64 steps
        (keras.layers.GRU(32, return_sequences=True), steps, 2 * (20 * 3 * 32 + 32 * 3 * 32) * 64),
    ]:
        model = keras.Model(source, layer(source))
        assert forward_flops_per_example(model) == flops, type(layer).__name__
        if source is image:
            (compute,) = [x for x in spec_sheet.layers(model) if x.kind == "compute"]
            assert compute.algorithm == "implicit"
    unknown = keras.Model(image, keras.layers.PReLU()(image))  # weights, no formula
    with pytest.raises(UserError, match=r"not priced on spec sheets: no FLOP formula for layer p_re_lu \(PReLU; .*\); "
                                        "runner predict without hardware= prices the model on this machine"):
        spec_sheet.layers(unknown)  # was '...; add one to runner/measure/flops.py', an edit of the tool's source


def test_a_spec_sheet_prediction_prints_its_table_and_efficiency(capsys):
    code, out, err = subcommand(capsys, "predict", "-m", *RESNET50_ON_DGX1, "gpus=1,8",
                                "strategy=parameter_server,mirrored")
    assert code == 0, err
    rows = markdown_rows(out)
    assert len(rows) == 4 and all(float(r["predicted images/s"].replace(",", "")) > 0 for r in rows)
    efficiency = {r["combination"].split(" ", 1)[1]: int(r["efficiency"].rstrip("%")) for r in rows}
    # one device alone is the base; a parameter server on the CPU pays for the host link and update even then
    assert efficiency["mirrored/split x1"] == 100 and efficiency["parameter_server/split x1"] < 100
    assert all(50 < e <= 100 for e in efficiency.values())
    assert "on dgx1_p100's spec sheet)" in out  # what the constants were fitted to: no caveat


def test_rows_of_two_hardware_or_two_precisions_name_what_differs(capsys):
    """Was: `hardware=dgx1_p100,gce_k80x8` printed two rows named `mlp/default mirrored/split x8`."""
    code, out, err = subcommand(capsys, "predict", "-m", "hardware=dgx1_p100,gce_k80x8", "gpus=8", "strategy=mirrored",
                                "train.precision=float32,mixed_float16")
    assert code == 0, err
    assert sorted(r["combination"] for r in markdown_rows(out)) == [
        f"mlp/default mirrored/split x8 hardware={h} train.precision={p}"
        for h in ("dgx1_p100", "gce_k80x8") for p in ("float32", "mixed_float16")]


def test_each_model_has_its_own_predicted_fastest(capsys):
    """Was one 'predicted fastest: mlp/default ...' over an MLP's and a CNN's images/s: two models ranked as one."""
    code, out, err = subcommand(capsys, "predict", "-m", "hardware=dgx1_v100", "model=mlp,lenet", "gpus=8",
                                "strategy=mirrored,replicated")
    fastest = [line for line in out.splitlines() if line.startswith("predicted fastest: ")]
    assert code == 0 and [line.split()[2] for line in fastest] == ["mlp/default", "lenet/default"], out + err
    # and where they are predicted for: the lines named no hardware, nor that Volta's constants are Pascal's
    assert all("images/s, on dgx1_v100's spec sheet; volta priced with pascal's constants, unchecked against any "
               "published table)" in line for line in fastest), fastest


def test_sixteen_bits_on_a_gpu_without_tensor_cores_is_said_to_be_priced_as_float32(capsys):
    """A P100's mixed_float16 row equalled its float32 row with nothing saying why; a V100's has tensor cores."""
    code, out, err = subcommand(capsys, "predict", "-m", "experiment=tf_cnn_resnet50", "hardware=dgx1_p100,dgx1_v100",
                                "gpus=8", "strategy=mirrored", "train.precision=float32,mixed_float16")
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert code == 0 and notes == ["note: train.precision=mixed_float16 on hardware=dgx1_p100 is priced as float32: "
                                   "the Tesla P100 SXM2 16GB has no tensor cores (Keras warns it may run slower)"], out
    code, out, err = subcommand(capsys, "predict", "-m", "experiment=tf_cnn_resnet50", "hardware=dgx1_p100",
                                "gpus=8", "strategy=mirrored", "train.precision=mixed_float16", "predict.format=json")
    assert "priced as float32" in json.loads(out.splitlines()[0])["note"], out


def test_a_refused_rows_name_is_the_users_overrides_without_hydras_settings(capsys, tmp_path):
    """With --config-dir, a refused row was named `hydra.searchpath=[file:///...] model=mlp ...`."""
    code, out, err = subcommand(capsys, "predict", "-m", "--config-dir", str(tmp_path), "hardware=dgx1_v100",
                                "strategy=mirrored,single", "gpus=2")
    refused = [r for r in markdown_rows(out) if "not predicted" in r]
    assert code == 0 and [r["combination"] for r in refused] == ["hardware=dgx1_v100 strategy=single gpus=2"], out


def test_pipelines_priced_alike_on_a_spec_sheet_say_why_they_tie(capsys):
    """Three pipelines at one rate were 'a tie for this model' with nothing saying that none of them is priced."""
    code, out, err = subcommand(capsys, "predict", "-m", "hardware=dgx_a100", "model=cnn", "strategy=mirrored",
                                "pipeline=split,per_tower,sharded", "gpus=8")
    (fastest,) = [line for line in out.splitlines() if line.startswith("predicted fastest: ")]
    assert code == 0 and fastest.endswith("; a spec sheet prices no input pipeline: which pipeline is fastest is "
                                          "measured on this machine (runner predict without hardware=)"), out
    code, out, err = subcommand(capsys, "predict", "-m", "hardware=dgx_a100", "model=cnn", "gpus=8",
                                "strategy=mirrored,parameter_server")  # strategies: priced, no such words
    assert code == 0 and "prices no input pipeline" not in out, out


def test_each_settings_fastest_line_comes_in_the_tables_order(capsys):
    """A V100 sweep over precision printed float32's line first while mixed_float16's rows led the table."""
    code, out, err = subcommand(capsys, "predict", "-m", "hardware=dgx1_v100", "experiment=tf_cnn_resnet50", "gpus=8",
                                "strategy=mirrored,parameter_server", "train.precision=float32,mixed_float16")
    first_row = markdown_rows(out)[0]["combination"]
    fastest = [line for line in out.splitlines() if line.startswith("predicted fastest: ")]
    assert code == 0 and "mixed_float16" in first_row and len(fastest) == 2, out
    assert fastest[0].startswith(f"predicted fastest: {first_row} ("), fastest


def test_the_json_form_has_one_object_per_combination(capsys):
    code, out, err = subcommand(capsys, "predict", "-m", *RESNET50_ON_DGX1, "gpus=2,4", "strategy=mirrored",
                                "predict.format=json")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["gpus"] for r in records] == [2, 4] and "fits" not in records[0]  # was "fits": false for no cost model
    for r in records:
        assert {"strategy", "pipeline", "gpus", "nodes", "rate", "unit", "step_seconds", "predicted"} <= set(r)
        assert r["strategy"] == "mirrored" and r["unit"] == "images" and r["predicted"] and r["nodes"] == 1
        assert (r["hardware"], r["architecture"]) == ("dgx1_p100", "pascal")  # what it is a prediction for
        assert r["rate"] == pytest.approx(2 * 64 * (r["gpus"] // 2) / r["step_seconds"])
    # the nodes a prediction is priced on (9 on nodes of 8: 3 nodes of 3), not 9 / 8 rounded up (was 2)
    code, out, err = subcommand(capsys, "predict", "-m", "experiment=tf_cnn_resnet50", "hardware=ec2_p2_8xlarge",
                                "hardware.nodes=8", "strategy=multi_worker", "gpus=8,9,10", "predict.format=json")
    assert code == 0 and [json.loads(line)["nodes"] for line in out.splitlines()] == [1, 3, 2], out + err


@pytest.mark.parametrize("argv, wanted", [
    (["hardware=dgx9"], ["hardware=dgx9", "dgx1_p100", "ec2_p2_8xlarge", "this"]),
    (["hardware=dgx1_p100", "gpus=9", "strategy=mirrored"], ["gpus=9", "1 to 8", "strategy=multi_worker"]),
    (["hardware=dgx1_p100", "gpus=-1", "strategy=mirrored"], ["gpus=-1", "1 to 8"]),  # was this machine's 0 to 16
    (["hardware=ec2_p2_8xlarge", "hardware.nodes=2", "gpus=17", "strategy=multi_worker"],
     ["gpus=17", "1 to 16", "hardware.nodes=2"]),
    (["hardware=dgx1_p100", "hardware.accelerator.memory_bandwidth=null"],
     ["hardware.accelerator.memory_bandwidth", "None", "float"]),
    (["hardware=dgx1_p100", "predict.format=xml"], ["predict.format='xml'", "table, json"]),
    # figures in GB/s, TFLOPS, GHz: were priced (0 images/s, exit 0)
    (["hardware=dgx1_p100", "hardware.accelerator.memory_bandwidth=732"],
     ["hardware.accelerator.memory_bandwidth=732", "bytes/s, at least 1e+09 (900e9 for 900 GB/s)"]),
    (["hardware=dgx1_p100", "hardware.accelerator.peak_flops=10.6"], ["peak_flops=10.6", "FLOP/s, at least"]),
    (["hardware=dgx1_p100", "hardware.accelerator.clock_hz=1.48"], ["clock_hz=1.48", "Hz, at least 1e+06", "or null"]),
    (["hardware=dgx1_p100", "hardware.link.bandwidth=20"], ["hardware.link.bandwidth=20", "bytes/s, at least"]),
    # words where a number goes: were OmegaConf's "Value 'fast' of type 'str' could not be converted to Float"
    (["hardware=dgx1_p100", "hardware.link.bandwidth=fast"],
     ["hardware.link.bandwidth='fast' is not allowed; expected bytes/s, at least 1e+08 (25e9 for 25 GB/s)"]),
    (["hardware=dgx1_p100", "hardware.nodes=abc"], ["hardware.nodes='abc' is not allowed; expected a positive integer"]),
    (["hardware=dgx1_p100", "hardware.devices_per_node=2.5"],  # was "a positive number of devices"
     ["hardware.devices_per_node=2.5 is not allowed; expected a positive integer (devices)"]),
    # tensor cores where there are none, or slower than float32: were priced (mixed_float16 13x slower, no word)
    (["hardware=dgx1_p100", "hardware.accelerator.tensor_flops=125e12"],
     ["tensor_flops=1.25e+14: a pascal GPU has no tensor cores (Volta and later have); use null"]),
    # a misspelt key of the sheet: was Hydra's "To append ... use +hardware.accelerator.peak_flop", then
    # "Key 'peak_flop' not in 'Accelerator'" with no key named
    (["hardware=dgx1_p100", "hardware.accelerator.peak_flop=1e12"],
     ["hardware.accelerator.peak_flop is not a key of the chosen hardware; did you mean "
      "hardware.accelerator.peak_flops?"]),
    (["hardware=dgx1_p100", "+hardware.accelerator.peak_flop=1e12"],
     ["Key 'peak_flop' not in 'Accelerator'; did you mean hardware.accelerator.peak_flops?"]),
    (["hardware=dgx1_p100", "hardware.acelerator.peak_flops=1e12"], ["did you mean hardware.accelerator?"]),
    # misspelt in every option: not "of the chosen hardware", and every key, not the first 12 of them
    (["hardware=dgx1_p100", "hardware.qqq.x=1"], ["hardware.qqq.x is not a key of any hardware; the hardware options' "
                                                  "keys: hardware.accelerator, ", "hardware.nodes"]),
    # a named architecture with tensor cores, none given: mixed_float16 was priced as float32, 'has no tensor cores'
    (["hardware=dgx1_v100", "hardware.accelerator.tensor_flops=null"],
     ["hardware.accelerator.tensor_flops is not set, and a volta GPU has tensor cores", "(V100: 125e12)"]),
    (["hardware=dgx1_v100", "hardware.accelerator.tensor_flops=1e12"],
     ["tensor_flops=1e+12 is below peak_flops=1.57e+13", "dense float16 tensor-core figure"]),
    # one combination no cost model covers (was a one-row 'not predicted' table, exit 1)
    (["strategy=model_parallel", "gpus=2"], ["strategy=model_parallel has no cost model", "mirrored"]),
    (["hardware=dgx1_p100", "strategy=model_parallel", "gpus=2"], ["strategy=model_parallel has no spec-sheet"]),
    # one combination the spec sheet refuses (was a 'not predicted' row and 'predicted fastest: none', exit 1)
    (["hardware=dgx1_v100", "train.precision=mixed_bfloat16", "gpus=8", "strategy=mirrored"],
     ["mixed_bfloat16", "mixed_float16"]),
    (["hardware=dgx_a100", "train.per_device_batch_size=4096", "strategy=mirrored"],
     ["train.per_device_batch_size="]),
    # just over the memory: was 'needs 11.8 GB per device ... (GeForce RTX 2080 Ti: 11.8 GB)'
    (["hardware=pcie_8x_2080ti", "gpus=1", "strategy=mirrored", "train.per_device_batch_size=139"],
     ["needs 11.805 GB per device", "(GeForce RTX 2080 Ti: 11.800 GB); use train.per_device_batch_size=138 or less"]),
])
def test_bad_hardware_input_is_one_line(capsys, argv, wanted):
    """One combination (not a sweep): what the runner refuses, or what no cost model covers, is the command's one
    `error:` line and exit 2, as for a run, not a table row of what was not predicted."""
    code, out, err = subcommand(capsys, "predict", "experiment=tf_cnn_resnet50", *argv)
    assert code == 2 and out == "" and err.strip().splitlines() == [err.strip()], out + err
    assert err.startswith("error: ") and all(w in err for w in wanted), err


def test_a_users_hardware_yaml_missing_a_field_is_named(capsys, tmp_path):
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "mine.yaml").write_text(
        "_target_: runner.hardware.SpecSheet\nname: mine\naccelerator:\n  name: card\n  peak_flops: 1.0e13\n"
        "  memory_bytes: 8.0e9\n  memory_bandwidth: 4.0e11\ndevices_per_node: 2\nlink: {kind: pcie, bandwidth: 1.0e10}\n"
        "host: {bandwidth: 1.0e10, memory_bandwidth: 5.0e10}\n")  # no network
    code, out, err = subcommand(capsys, "predict", "--config-dir", str(tmp_path), "experiment=tf_cnn_resnet50",
                                "hardware=mine", "gpus=2", "strategy=mirrored")
    assert code != 0 and "hardware.network.bandwidth is not set" in out + err, out + err
    with open(tmp_path / "hardware" / "mine.yaml", "a") as f:
        f.write("network: {bandwidth: 1.0e9, latency: 1.0e-5}\n")
    code, out, err = subcommand(capsys, "predict", "--config-dir", str(tmp_path), "experiment=tf_cnn_resnet50",
                                "hardware=mine", "gpus=2", "strategy=mirrored")
    assert code == 0 and "x2" in out, out + err
    # no architecture named: priced with Pascal's constants, which no table checked for this card (was said nowhere)
    assert "on mine's spec sheet; an unnamed architecture priced with pascal's constants, unchecked" in out, out


def test_a_users_hardware_yaml_of_the_wrong_shape_is_told_what_it_needs(capsys, tmp_path):
    """A sheet without `_target_` ("choose one of: this"), a section given as a value (OmegaConf's "Merge error: str
    is not a subclass of Accelerator", no key named) and a misspelt key each get one line saying what is needed."""
    (tmp_path / "hardware").mkdir()
    sheet = "name: mine\ndevices_per_node: 2\n"
    for text, wanted in [(sheet + "accelerator: {name: x}\n", "hardware.name='mine' is not a built-in hardware "
                                                                 "(this), and a hardware YAML of your own names its "
                                                                 "class: _target_: runner.hardware.SpecSheet"),
                         ("_target_: runner.hardware.SpecSheet\n" + sheet + "accelerator: P100\n",
                          "hardware.accelerator='P100' is not allowed; expected its keys: name, architecture, "),
                         ("_target_: runner.hardware.SpecSheet\n" + sheet + "accelerator: {memory_bandwith: 1}\n",
                          "Key 'memory_bandwith' not in 'Accelerator'; did you mean hardware.accelerator.memory_bandwidth")]:
        (tmp_path / "hardware" / "mine.yaml").write_text(text)
        code, out, err = subcommand(capsys, "predict", "--config-dir", str(tmp_path), "experiment=tf_cnn_resnet50",
                                    "hardware=mine", "gpus=1", "strategy=single")
        assert code == 2 and err.startswith("error: ") and wanted in err and len(err.strip().splitlines()) == 1, err


def test_a_users_sheet_is_read_under_its_own_name_or_refused(capsys, tmp_path):
    """A copy of dgx1_p100.yaml at half the peak in the user's folder was silently not read (Hydra finds the shipped
    one first: the shipped rate printed); a copy named mine.yaml that kept `name: dgx1_p100` was labelled as that."""
    shipped = (REPO / "conf" / "hardware" / "dgx1_p100.yaml").read_text()
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "dgx1_p100.yaml").write_text(shipped.replace("peak_flops: 10.6e12", "peak_flops: 5.3e12"))
    (tmp_path / "hardware" / "mine.yaml").write_text(shipped)
    for chosen, wanted in [("dgx1_p100", f"hardware=dgx1_p100: {tmp_path}/hardware/dgx1_p100.yaml is not read, the "
                                         "runner's own conf/hardware/dgx1_p100.yaml is"),
                           ("mine", "hardware=mine's sheet says name: dgx1_p100, and its predictions would be labelled "
                                    "so; set name: mine in it")]:
        code, out, err = subcommand(capsys, "predict", "--config-dir", str(tmp_path), "experiment=tf_cnn_resnet50",
                                    f"hardware={chosen}", "gpus=1", "strategy=single")
        assert code == 2 and err.startswith(f"error: {wanted}") and len(err.strip().splitlines()) == 1, out + err
    code, out, err = subcommand(capsys, "predict", "--config-dir", str(REPO / "conf"), "experiment=tf_cnn_resnet50",
                                "hardware=dgx1_p100", "gpus=1", "strategy=single")  # the shipped file itself
    assert code == 0, err
    (tmp_path / "hardware" / "mine.yaml").write_text(shipped.replace("name: dgx1_p100", "name: mine"))
    code, out, err = subcommand(capsys, "predict", "--config-dir", str(tmp_path), "experiment=tf_cnn_resnet50",
                                "hardware=mine", "gpus=1", "strategy=single")
    assert code == 0 and "on mine's spec sheet" in out, out + err


def test_a_batch_that_fits_no_device_is_refused_with_what_would():
    (outcome,) = predict_all([["experiment=tf_cnn_vgg16", "hardware=gce_k80x8", "gpus=1", "strategy=single",
                               "train.per_device_batch_size=512"]])
    assert outcome.prediction is None
    assert "train.per_device_batch_size=512 needs" in outcome.error and "Tesla K80" in outcome.error
    most = int(outcome.error.split("train.per_device_batch_size=")[2].split(" ")[0])
    (fits,) = predict_all([["experiment=tf_cnn_vgg16", "hardware=gce_k80x8", "gpus=1", "strategy=single",
                            f"train.per_device_batch_size={most}"]])
    assert fits.prediction is not None and 0 < most < 512


def test_sixteen_bits_are_priced_where_the_accelerator_has_them():
    """Was: bfloat16 on a V100 priced at its float16 tensor cores (2.4x float32), float16 on a K80 faster too."""
    def rate(hardware, precision):
        (outcome,) = predict_all([["experiment=tf_cnn_resnet50", f"hardware={hardware}", "gpus=1", "strategy=single",
                                   f"train.precision={precision}"]])
        return outcome

    assert rate("gce_k80x8", "mixed_float16").prediction.rate == rate("gce_k80x8", "float32").prediction.rate
    assert rate("dgx1_v100", "mixed_float16").prediction.rate > 2 * rate("dgx1_v100", "float32").prediction.rate
    assert rate("dgx_a100", "mixed_bfloat16").prediction.rate == rate("dgx_a100", "mixed_float16").prediction.rate
    for hardware, instead in (("dgx1_v100", "mixed_float16"), ("gce_k80x8", "float32")):
        refused = rate(hardware, "mixed_bfloat16")
        assert refused.prediction is None and "has no bfloat16 arithmetic" in refused.error
        assert f"; use train.precision={instead}" in refused.error


def test_a_model_with_embedding_tables_is_not_priced_on_a_spec_sheet_and_its_row_says_so():
    """Was: dlrm's tables priced as nothing (no memory, update or rows moved): 188,519 examples/s with 0.54 GB tables
    and the same with 3.3 GB ones, which no 2080 Ti holds with Adam's state. The GPT's tied table is priced (its
    gradient is dense, a layer's weights)."""
    dlrm, gpt = predict_all([["model=dlrm", "data=clicks", "data.tables=tiny", "hardware=pcie_8x_2080ti", "gpus=4",
                              "strategy=hybrid"],
                             ["model=gpt", "data=shakespeare", "hardware=pcie_8x_2080ti", "gpus=4", "strategy=mirrored"]])
    assert dlrm.prediction is None and "embedding tables (" in dlrm.error and "not priced on spec sheets" in dlrm.error
    assert gpt.prediction is not None and gpt.prediction.unit == "tokens"


def test_the_gpts_tied_output_layer_and_attention_scores_are_priced():
    """Were priced as nothing: the tied table's output matmul (2 t c V FLOPs), its weights (all-reduced, updated) and
    its logits, and the heads' (t, t) scores and weights: a vocabulary of 256 and one of 50,257 gave one rate, and a
    context of 4,096 was said to fit 35 per P100 where 3 do (GPT.activations_per_example counts the scores)."""
    from runner.data_pipelines import language_model
    from runner.models.gpt import SIZES, GPT

    t, v = 64, 300
    layers = spec_sheet.layers(GPT(variant="tiny").build(language_model(t, v)))
    blocks, heads, c, _ = SIZES["tiny"]
    (output,) = [x for x in layers if x.kind == "compute" and x.flops == 2.0 * t * c * v]
    assert output.weight_bytes == 4 * v * c and output.kept == 4 * t * v and output.algorithm == "gemm"
    attention = [x for x in layers if x.kept == 4 * (t * c + 2 * heads * t * t + 3 * t * c)]  # output, scores, q k v
    assert len(attention) == blocks
    small, large = predict_all([["model=gpt", "model.variant=baby", "data=synthetic", "data.task=next_token",
                                 "data.sequence_length=256", f"data.vocabulary_size={size}",
                                 "train.global_batch_size=64", "hardware=dgx_a100", "gpus=8", "strategy=mirrored"]
                                for size in (256, 50257)])
    assert large.prediction.rate < small.prediction.rate / 2  # the output layer: 9.9 of 15.9 GFLOP per example


def test_cross_attention_and_a_shared_lookup_table_are_priced_as_what_they_do():
    """Cross-attention's scores are (t_q, t_k), its keys and values projected at t_k positions (was t_q x t_q: 4
    queries over 512 keys kept 70x too little); an Embedding that counts its FLOPs and is called twice on ids is two
    lookups, not a tied output matmul."""
    import keras

    from runner.measure.flops import forward_flops_per_example

    query, memory = keras.Input((4, 32)), keras.Input((512, 48))
    model = keras.Model([query, memory], keras.layers.MultiHeadAttention(4, 16, value_dim=8)(query, memory))
    (attention,) = [x for x in spec_sheet.layers(model) if x.kind == "compute"]
    scores, projected = 4 * 4 * 4 * 512, 4 * 4 * (4 * 16 + 512 * (16 + 8))
    assert attention.kept == 4 * 4 * 32 + 2 * scores + projected
    kernels = 2 * (32 * 4 * 16 * 4 + 4 * 8 * 32 * 4 + (48 * 4 * 16 + 48 * 4 * 8) * 512)  # q and output at 4, k v at 512
    assert forward_flops_per_example(model) == kernels + 2 * 4 * 512 * 4 * (16 + 8)

    class Counted(keras.layers.Embedding):
        def forward_flops_per_example(self) -> float:
            return 0.0

    table, a, b = Counted(100, 8), keras.Input((3,), dtype="int32"), keras.Input((3,), dtype="int32")
    shared = keras.Model([a, b], keras.layers.Concatenate()([table(a), table(b)]))
    assert [x.kind for x in spec_sheet.layers(shared)] == ["lookup", "elementwise"]


def test_a_batch_too_large_under_strong_scaling_is_told_as_the_global_batch(capsys):
    """Was 'use train.per_device_batch_size=3 or less', which the runner then refuses as derived (strong scaling)."""
    code, out, err = subcommand(capsys, "predict", "model=gpt", "data=shakespeare", "model.variant=baby",
                                "data.sequence_length=4096", "hardware=dgx1_p100", "train.global_batch_size=64", "gpus=8",
                                "strategy=mirrored")
    assert code == 2 and "train.global_batch_size=64 (8 per device) needs 43.5 GB per device" in err, out + err
    assert err.strip().endswith("use train.global_batch_size=24 or less (3 per device)"), err
    code, out, err = subcommand(capsys, "predict", "model=gpt", "data=shakespeare", "model.variant=baby",
                                "data.sequence_length=4096", "hardware=dgx1_p100", "train.global_batch_size=24", "gpus=8",
                                "strategy=mirrored")
    assert code == 0 and "gpt/baby mirrored/split x8" in out, out + err
    # the constants were fitted to image CNNs' images/s: said of tokens/s (was nothing on a P100, the fitted GPU)
    assert "on dgx1_p100's spec sheet; tokens/s priced with constants fitted to image CNNs, unchecked" in out, out
    # weights alone too large: was '... or strategy=model_parallel', which a spec sheet cannot price
    code, out, err = subcommand(capsys, "predict", "experiment=tf_cnn", "model=keras_app", "model.app=VGG16",
                                "hardware=dgx1_p100", "hardware.accelerator.memory_bytes=1e9", "gpus=8",
                                "strategy=mirrored")
    assert code == 2 and err.strip().endswith("alone do not fit: use a device with more memory"), err


def test_a_run_trains_on_this_machine_and_hardware_changes_no_config_hash():
    plain = validate(compose("strategy=mirrored", "gpus=2"))
    named = validate(compose("strategy=mirrored", "gpus=2", "hardware=dgx1_p100"), priced=True)
    assert plain.config_hash == named.config_hash and plain.hardware.measured and not named.hardware.measured
    # A run with a spec sheet would train here and be recorded as on its GPUs: refused, naming the command that prices
    with pytest.raises(ConfigError, match=r"^hardware=dgx1_p100 is a spec sheet that `runner predict` prices; a run "
                       r"trains on this machine: drop hardware=dgx1_p100, or predict with `runner predict "):
        validate(compose("strategy=mirrored", "gpus=2", "hardware=dgx1_p100"))
    with pytest.raises(ConfigError, match="gpus=17 is not allowed; expected an integer from 0 to 16"):
        validate(compose("strategy=mirrored", "gpus=17"))


@pytest.mark.slow
def test_predictions_match_the_published_tables_without_reading_them(monkeypatch):
    """The acceptance figures of issue #62 against TensorFlow's 2017 tables: median error <= 10%, no cell beyond
    25%, and the scaling efficiency at the largest count within 5 points for the DGX-1's ResNet-50 (8 GPUs) and
    EC2's distributed ResNet-50 (64 GPUs). The predictions are made with every CSV unreadable."""
    cells = published.cells()
    real_open, real_read = builtins.open, pathlib.Path.read_text

    def refuse(path, *args, **kwargs):
        if str(path).endswith(".csv"):
            raise AssertionError(f"the predictor read {path}")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: refuse(self) and real_read(self, *a, **k))
    rates = published.predicted(cells)
    monkeypatch.undo()
    summary, lines = published.summarise(rates)
    assert all(rates.values()) and len(summary.errors) == len(cells) > 100
    assert summary.median <= 0.10 and max(summary.errors) <= 0.25, lines[-1]
    for group in [("dgx1_p100", "resnet50", 64, "parameter_server cpu"),
                  ("ec2_p2_8xlarge", "resnet50", 64, "distributed_replicated")]:
        assert abs(summary.efficiency_gaps[group]) <= 5, (group, summary.efficiency_gaps[group])
