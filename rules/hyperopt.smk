rule hyperopt_worker:
    input:
        manifest="results/features/manifest.json",
        folds="results/folds.json",
    output:
        "results/hyperopt/{algo}/worker_{worker}.json",
    log:
        "results/logs/hyperopt/{algo}/worker_{worker}.log",
    benchmark:
        "results/benchmarks/hyperopt/{algo}/worker_{worker}.tsv"
    conda:
        ENV_FILE
    threads: 1
    resources:
        gpu=GPU_UNITS,
    params:
        config=config,
    script:
        "../workflow_scripts/hyperopt_worker.py"


rule hyperopt_best:
    input:
        hyperopt_worker_summaries,
    output:
        "results/hyperopt/{algo}.json",
    log:
        "results/logs/hyperopt/{algo}_best.log",
    benchmark:
        "results/benchmarks/hyperopt/{algo}_best.tsv"
    conda:
        ENV_FILE
    threads: 1
    params:
        config=config,
    script:
        "../workflow_scripts/hyperopt_best.py"
