rule evaluate:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
        models=seed_models,
    output:
        metrics=seed_outputs(paths.EVAL_METRICS),
        bars=seed_outputs(paths.EVAL_BARS),
    log:
        paths.log("evaluate/{algo}/fold_{fold}"),
    benchmark:
        paths.benchmark("evaluate/{algo}/fold_{fold}")
    conda:
        ENV_FILE
    threads: 1
    resources:
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("evaluate"),
        code=code_hash("evaluate"),
        seeds=evaluation_seeds,
    script:
        "../workflow_scripts/evaluate.py"


rule baselines:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
    output:
        metrics=paths.BASELINE_METRICS,
        bars=paths.BASELINE_BARS,
    log:
        paths.log("evaluate/baselines/fold_{fold}"),
    benchmark:
        paths.benchmark("evaluate/baselines/fold_{fold}")
    conda:
        ENV_FILE
    threads: 1
    params:
        config=stage_config("baselines"),
        code=code_hash("baselines"),
    script:
        "../workflow_scripts/baselines.py"
