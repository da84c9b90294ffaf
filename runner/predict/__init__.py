"""The cost model: each combination's predicted step time as named terms, from the model's shapes and a few
calibrations of this machine (runner/predict/calibrate.py), before anything trains."""
