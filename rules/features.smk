rule features:
    input:
        unpack(feature_inputs),
    output:
        "results/features/{stem}.parquet",
    log:
        "results/logs/features/{stem}.log",
    benchmark:
        "results/benchmarks/features/{stem}.tsv"
    conda:
        ENV_FILE
    threads: 1
    params:
        bar_size=config["data"]["bar_size"],
        code=pipeline.code_hash(),
    script:
        "../workflow_scripts/features.py"


rule feature_manifest:
    input:
        pipeline.feature_files(config),
    output:
        "results/features/manifest.json",
    log:
        "results/logs/feature_manifest.log",
    benchmark:
        "results/benchmarks/feature_manifest.tsv"
    conda:
        ENV_FILE
    threads: 1
    script:
        "../workflow_scripts/feature_manifest.py"
