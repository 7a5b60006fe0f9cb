rule report:
    input:
        evals=pipeline.eval_files(config),
        bars=pipeline.eval_bar_files(config),
        hyperopt=pipeline.hyperopt_files(config),
        folds=paths.FOLDS,
        train_logs=pipeline.train_log_files(config),
        manifest=paths.FEATURE_MANIFEST,
    output:
        report=paths.REPORT,
        verdict=paths.VERDICT,
    log:
        paths.log("report"),
    benchmark:
        paths.benchmark("report")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("report"),
    params:
        config=stage_config("report"),
        code=code_hash("report"),
    script:
        "../workflow_scripts/report.py"
