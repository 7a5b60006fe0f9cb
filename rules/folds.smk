rule folds:
    input:
        pipeline.feature_files(config),
    output:
        paths.FOLDS,
    log:
        paths.log("folds"),
    benchmark:
        paths.benchmark("folds")
    conda:
        ENV_FILE
    threads: 1
    params:
        config=stage_config("folds"),
        code=code_hash("folds"),
    script:
        "../workflow_scripts/folds.py"
