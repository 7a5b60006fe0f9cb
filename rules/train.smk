rule train:
    input:
        manifest="results/features/manifest.json",
        folds="results/folds.json",
        hparams=hyperopt_params,
    output:
        model="results/models/{algo}/fold_{fold}/seed_{seed}/model.pt",
        log_json="results/models/{algo}/fold_{fold}/seed_{seed}/train_log.json",
    log:
        "results/logs/train/{algo}/fold_{fold}/seed_{seed}.log",
    benchmark:
        "results/benchmarks/train/{algo}/fold_{fold}/seed_{seed}.tsv"
    conda:
        ENV_FILE
    threads: 1
    resources:
        gpu=GPU_UNITS,
    params:
        config=config,
    script:
        "../workflow_scripts/train.py"
