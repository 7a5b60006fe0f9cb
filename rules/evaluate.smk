rule evaluate:
    input:
        manifest="results/features/manifest.json",
        folds="results/folds.json",
        model=trained_model,
    output:
        metrics="results/eval/{algo}/fold_{fold}/seed_{seed}/metrics.json",
        bars="results/eval/{algo}/fold_{fold}/seed_{seed}/bars.parquet",
    log:
        "results/logs/evaluate/{algo}/fold_{fold}/seed_{seed}.log",
    benchmark:
        "results/benchmarks/evaluate/{algo}/fold_{fold}/seed_{seed}.tsv"
    conda:
        ENV_FILE
    threads: 1
    resources:
        gpu=GPU_UNITS,
    params:
        config=config,
    script:
        "../workflow_scripts/evaluate.py"


rule baselines:
    input:
        manifest="results/features/manifest.json",
        folds="results/folds.json",
    output:
        metrics="results/eval/baselines/fold_{fold}/metrics.json",
        bars="results/eval/baselines/fold_{fold}/bars.parquet",
    log:
        "results/logs/evaluate/baselines/fold_{fold}.log",
    benchmark:
        "results/benchmarks/evaluate/baselines/fold_{fold}.tsv"
    conda:
        ENV_FILE
    threads: 1
    params:
        config=config,
    script:
        "../workflow_scripts/baselines.py"
