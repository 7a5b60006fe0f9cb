# One study per model, or per model x fold under hyperopt.per_fold (common.smk: HYPEROPT_*_OUTPUT).
rule hyperopt_worker:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
    output:
        HYPEROPT_WORKER_OUTPUT,
    log:
        paths.log(HYPEROPT_WORKER_LOG),
    benchmark:
        paths.benchmark(HYPEROPT_WORKER_LOG)
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=tuning_mem_mb,
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
        HYPEROPT_BEST_OUTPUT,
    log:
        paths.log(HYPEROPT_BEST_LOG),
    benchmark:
        paths.benchmark(HYPEROPT_BEST_LOG)
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("hyperopt_best"),
    params:
        config=model_stage_config("hyperopt_best"),
        code=code_hash("hyperopt_best"),
        results_dir=study_results_dir,
    script:
        "../workflow_scripts/hyperopt_best.py"
