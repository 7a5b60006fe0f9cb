# One job per model x fold trains all its seeds (one batch where the model can; docs/ARCHITECTURE.md); every
# seed keeps its own model.pt and train_log.json, so naming one seed's file as a target reruns its job.
rule train:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
        hparams=hyperopt_params,
    output:
        models=seed_outputs(paths.MODEL),
        logs=seed_outputs(paths.TRAIN_LOG),
    log:
        paths.log("train/{model}/fold_{fold}"),
    benchmark:
        paths.benchmark("train/{model}/fold_{fold}")
    wildcard_constraints:
        model=STOCHASTIC_MODELS,
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=train_mem_mb,
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("train"),
        code=code_hash("train"),
        resume=resume_file,
        tensorboard=tensorboard_dirs,
        seeds=run_seeds,
    script:
        "../workflow_scripts/train.py"


# A deterministic model (ridge: its seeds could not differ) trains one run, seed 0.
use rule train as train_once with:
    output:
        models=[paths.MODEL.replace("{seed}", "0")],
        logs=[paths.TRAIN_LOG.replace("{seed}", "0")],
    log:
        paths.log("train/{model}/fold_{fold}"),
    benchmark:
        paths.benchmark("train/{model}/fold_{fold}")
    wildcard_constraints:
        model=DETERMINISTIC_MODELS,
