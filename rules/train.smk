# One job per model x fold trains all its seeds (one batch where the model can; docs/ARCHITECTURE.md); every
# seed keeps its own model.pt and train_log.json, so naming one seed's file as a target reruns its job.
# With training.batch_folds, rule train_folds below trains the stochastic models instead.
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
        model=FOLD_TRAINED_MODELS,
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


# training.batch_folds: one job per model trains every fold x seed (an agent with as many folds on the batch
# axis as the device's memory holds); each fold x seed keeps the outputs of rule train, so naming one of them
# as a target reruns the model's job.
rule train_folds:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
        hparams=fold_hyperopt_params,
    output:
        models=fold_seed_outputs(paths.MODEL),
        logs=fold_seed_outputs(paths.TRAIN_LOG),
    log:
        paths.log("train/{model}/folds"),
    benchmark:
        paths.benchmark("train/{model}/folds")
    wildcard_constraints:
        model=FOLDS_BATCHED_MODELS,
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=train_folds_mem_mb,
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("train"),
        code=code_hash("train"),
        resume=fold_resume_files,
        tensorboard=fold_tensorboard_dirs,
        seeds=run_seeds,
        folds=FOLD_INDICES,
    script:
        "../workflow_scripts/train_folds.py"
