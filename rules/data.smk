rule demo_data:
    output:
        pipeline.demo_files(config),
    log:
        "results/logs/demo_data.log",
    benchmark:
        "results/benchmarks/demo_data.tsv"
    conda:
        ENV_FILE
    threads: 1
    params:
        start=config["data"]["demo"]["start"],
        days=config["data"]["demo"]["days"],
        seed=config["data"]["demo"]["seed"],
    script:
        "../workflow_scripts/demo_data.py"


rule download_databento:
    output:
        pipeline.databento_files(config),
    log:
        "results/logs/download_databento.log",
    benchmark:
        "results/benchmarks/download_databento.tsv"
    conda:
        ENV_FILE
    threads: 1
    params:
        request=config["data"]["databento"],
    script:
        "../workflow_scripts/download_databento.py"
