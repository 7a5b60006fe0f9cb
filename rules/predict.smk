# Trained models applied to new DBN files (predict.files; not part of `all`, docs/PREDICT.md):
#   snakemake --cores 2 predict_all            (or one table: results/predict/{model}/{stem}.parquet)


# A new file's feature table: the features rule (same job script, config slice and code hash), with the files that
# start before it among the training inputs and predict.files as lookback context. Shared by every model.
use rule features as predict_features with:
    input:
        unpack(predict_feature_inputs),
    output:
        paths.PREDICT_FEATURES,
    log:
        paths.log("predict/features/{stem}"),
    benchmark:
        paths.benchmark("predict/features/{stem}")


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
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("predict"),
        code=code_hash("predict"),
        seeds=run_seeds,
    script:
        "../workflow_scripts/predict.py"
