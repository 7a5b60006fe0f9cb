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
    resources:
        mem_mb=fixed_mem_mb("folds"),
    params:
        config=stage_config("folds"),
        code=code_hash("folds"),
    script:
        "../workflow_scripts/folds.py"
