# Validation beyond the schema, wildcard constraints and every input function (rules hold no lambdas).
from marketrl import pipeline
from marketrl.config import validate_config

# Fill defaults and run the cross-key checks; errors name the config key in one line.
config.update(validate_config(config))

RAW_FILES = pipeline.raw_data_files(config)
GPU_UNITS = pipeline.gpu_units(config)
ENV_FILE = "../envs/pipeline.yaml"


wildcard_constraints:
    stem=r"[^/]+",
    algo="|".join(config["training"]["algos"]),
    fold=r"\d+",
    seed=r"\d+",
    worker=r"\d+",


def feature_inputs(wildcards):
    """The DBN file of a feature table, plus the previous day's file as lookback context."""
    inputs = {"src": RAW_FILES[wildcards.stem]}
    previous = pipeline.previous_file(config, wildcards.stem)
    if previous is not None:
        inputs["prev"] = previous
    return inputs


def hyperopt_worker_summaries(wildcards):
    """Worker summaries of one algorithm's study."""
    return pipeline.hyperopt_worker_files(config, wildcards.algo)


def hyperopt_params(wildcards):
    """Best hyperparameters of the algorithm being trained."""
    return f"results/hyperopt/{wildcards.algo}.json"


def trained_model(wildcards):
    """The model an evaluation job scores."""
    return f"results/models/{wildcards.algo}/fold_{wildcards.fold}/seed_{wildcards.seed}/model.pt"
