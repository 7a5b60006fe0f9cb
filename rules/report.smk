rule report:
    input:
        evals=pipeline.eval_files(config),
        hyperopt=expand(
            "results/hyperopt/{algo}.json", algo=config["training"]["algos"]
        ),
        folds="results/folds.json",
        train_logs=pipeline.train_log_files(config),
    output:
        "results/eval_report.html",
    log:
        "results/logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    conda:
        ENV_FILE
    threads: 1
    params:
        config=config,
    script:
        "../workflow_scripts/report.py"
