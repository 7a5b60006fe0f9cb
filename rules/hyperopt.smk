rule hyperopt_worker:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
    output:
        paths.HYPEROPT_WORKER,
    log:
        paths.log("hyperopt/{algo}/worker_{worker}"),
    benchmark:
        paths.benchmark("hyperopt/{algo}/worker_{worker}")
    conda:
        ENV_FILE
    threads: 1
    resources:
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("hyperopt_worker"),
        code=code_hash("hyperopt_worker"),
        results_dir=study_results_dir,
    script:
        "../workflow_scripts/hyperopt_worker.py"


rule hyperopt_best:
    input:
        workers=hyperopt_worker_summaries,
        folds=paths.FOLDS,
    output:
        paths.HYPEROPT_BEST,
    log:
        paths.log("hyperopt/{algo}_best"),
    benchmark:
        paths.benchmark("hyperopt/{algo}_best")
    conda:
        ENV_FILE
    threads: 1
    params:
        config=model_stage_config("hyperopt_best"),
        code=code_hash("hyperopt_best"),
        results_dir=study_results_dir,
    script:
        "../workflow_scripts/hyperopt_best.py"
