rule folds:
    input:
        pipeline.feature_files(config),
    output:
        "results/folds.json",
    log:
        "results/logs/folds.log",
    benchmark:
        "results/benchmarks/folds.tsv"
    conda:
        ENV_FILE
    threads: 1
    params:
        folds=config["folds"],
    script:
        "../workflow_scripts/folds.py"
