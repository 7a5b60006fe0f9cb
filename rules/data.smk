rule demo_data:
    output:
        pipeline.demo_outputs(config),
    log:
        paths.log("demo_data"),
    benchmark:
        paths.benchmark("demo_data")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("demo_data"),
    params:
        config=stage_config("demo_data"),
        code=code_hash("demo_data"),
    script:
        "../workflow_scripts/demo_data.py"


rule download_databento:
    output:
        pipeline.databento_files(config),
    log:
        paths.log("download_databento"),
    benchmark:
        paths.benchmark("download_databento")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("download_databento"),
    params:
        config=stage_config("download_databento"),
        code=code_hash("download_databento"),
    script:
        "../workflow_scripts/download_databento.py"
