# Trained models applied to new DBN files (predict.files; not part of `all`, docs/PREDICT.md):
#   snakemake --cores 2 predict_all            (or one table: results/predict/{model}/{stem}.parquet)


# A new file's feature table: the features stage's job script, config slice and code hash on one file, with the
# files that start before it among the training inputs and predict.files as lookback context. Shared by every model.
rule predict_features:
    input:
        unpack(predict_feature_inputs),
    output:
        paths.PREDICT_FEATURES,
    log:
        paths.log("predict/features/{stem}"),
    benchmark:
        paths.benchmark("predict/features/{stem}")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("predict_features"),
    params:
        config=stage_config("features"),
        code=code_hash("features"),
        user=user_features_hash(),
        files=predict_feature_files,
    script:
        "../workflow_scripts/features.py"


# One job per model x new file: every seed's positions (and a forecaster's predictions), their ensemble and PnL.
rule predict:
    input:
        features=paths.PREDICT_FEATURES,
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
        models=predict_models,
        record=predict_record_metrics,
    output:
        paths.PREDICT,
    log:
        paths.log("predict/{model}/{stem}"),
    benchmark:
        paths.benchmark("predict/{model}/{stem}")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("predict"),
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("predict"),
        code=code_hash("predict"),
        seeds=run_seeds,
    script:
        "../workflow_scripts/predict.py"
