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
        user=user_features_hash(),
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


# features.user: the look-ahead audit of the user's feature file, once, before any features job (which takes its
# summary as input) uses it; a cheat fails here in one line.
rule user_features_audit:
    input:
        user_features_file(),
    output:
        paths.USER_FEATURES_AUDIT,
    log:
        paths.log("user_features_audit"),
    benchmark:
        paths.benchmark("user_features_audit")
    conda:
        ENV_FILE
    threads: 1
    params:
        config=stage_config("user_features_audit"),
        code=code_hash("user_features_audit"),
        user=user_features_hash(),
    script:
        "../workflow_scripts/user_features_audit.py"
