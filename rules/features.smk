rule features:
    input:
        unpack(feature_inputs),
    output:
        paths.FEATURES,
    log:
        paths.log("features/{stem}"),
    benchmark:
        paths.benchmark("features/{stem}")
    conda:
        ENV_FILE
    threads: 1
    params:
        config=stage_config("features"),
        code=code_hash("features"),
    script:
        "../workflow_scripts/features.py"


rule feature_manifest:
    input:
        pipeline.feature_files(config),
    output:
        paths.FEATURE_MANIFEST,
    log:
        paths.log("feature_manifest"),
    benchmark:
        paths.benchmark("feature_manifest")
    conda:
        ENV_FILE
    threads: 1
    params:
        config=stage_config("feature_manifest"),
        code=code_hash("feature_manifest"),
    script:
        "../workflow_scripts/feature_manifest.py"
