# features.batch: one job per batch of files (a month by default), each its own rule since a rule's outputs cannot
# depend on a wildcard; every table keeps its own path, so `snakemake <table>` runs the batch that writes it.
for batch, stems in FEATURE_BATCHES.items():

    rule:
        name:
            pipeline.feature_rule_name(batch)
        input:
            **feature_batch_inputs(stems),
        output:
            [paths.FEATURES.format(stem=stem) for stem in stems],
        log:
            paths.log(f"features/{batch}"),
        benchmark:
            paths.benchmark(f"features/{batch}")
        conda:
            ENV_FILE
        threads: 1
        # here, not in profiles/slurm (which names rules): a month of files, one at a time, each decoded once
        resources:
            mem_mb=fixed_mem_mb("features"),
            runtime=240,
        params:
            config=stage_config("features"),
            code=code_hash("features"),
            user=user_features_hash(),
            files=feature_batch_files(stems),
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
    resources:
        mem_mb=fixed_mem_mb("feature_manifest"),
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
    resources:
        mem_mb=fixed_mem_mb("user_features_audit"),
    params:
        config=stage_config("user_features_audit"),
        code=code_hash("user_features_audit"),
        user=user_features_hash(),
    script:
        "../workflow_scripts/user_features_audit.py"
