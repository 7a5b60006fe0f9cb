# Exported models (docs/OUTPUTS.md, "Exports"): not part of `all`; build one seed's directory by target,
#   snakemake --cores 1 results/export/ppo/fold_0/seed_0
# or every model, fold and seed of the config with `snakemake export_all` (make export).
# One job per model x fold exports every seed (all directories or none).
rule export:
    input:
        models=seed_models,
    output:
        dirs=export_outputs(paths.EXPORT_DIR),
    log:
        paths.log("export/{model}/fold_{fold}"),
    benchmark:
        paths.benchmark("export/{model}/fold_{fold}")
    wildcard_constraints:
        model=STOCHASTIC_MODELS,
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("export"),
    params:
        config=model_stage_config("export"),
        code=code_hash("export"),
    script:
        "../workflow_scripts/export.py"


# A deterministic model (ridge) has one run to export, seed 0.
use rule export as export_once with:
    output:
        dirs=[directory(paths.EXPORT_DIR.replace("{seed}", "0"))],
    log:
        paths.log("export/{model}/fold_{fold}"),
    benchmark:
        paths.benchmark("export/{model}/fold_{fold}")
    wildcard_constraints:
        model=DETERMINISTIC_MODELS,
