rule train:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
        hparams=hyperopt_params,
    output:
        model=paths.MODEL,
        log_json=paths.TRAIN_LOG,
    log:
        paths.log("train/{algo}/fold_{fold}/seed_{seed}"),
    benchmark:
        paths.benchmark("train/{algo}/fold_{fold}/seed_{seed}")
    conda:
        ENV_FILE
    threads: 1
    resources:
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("train"),
        code=code_hash("train"),
        resume=resume_file,
    script:
        "../workflow_scripts/train.py"
