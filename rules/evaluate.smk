# One job per model x fold scores every seed and its turnover-matched random traders in one batched pass; from the
# second fold on, its gate reads the earlier folds' metrics (the walk-forward record), so folds evaluate in order.
rule evaluate:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
        models=seed_models,
        record=record_metrics,
    output:
        metrics=seed_outputs(paths.EVAL_METRICS),
        bars=seed_outputs(paths.EVAL_BARS),
    log:
        paths.log("evaluate/{model}/fold_{fold}"),
    benchmark:
        paths.benchmark("evaluate/{model}/fold_{fold}")
    wildcard_constraints:
        model=STOCHASTIC_MODELS,
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("evaluate"),
        gpu=GPU_UNITS,
    params:
        config=model_stage_config("evaluate"),
        code=code_hash("evaluate"),
        seeds=run_seeds,
    script:
        "../workflow_scripts/evaluate.py"


# A deterministic model (ridge) has one run to score, seed 0.
use rule evaluate as evaluate_once with:
    output:
        metrics=[paths.EVAL_METRICS.replace("{seed}", "0")],
        bars=[paths.EVAL_BARS.replace("{seed}", "0")],
    log:
        paths.log("evaluate/{model}/fold_{fold}"),
    benchmark:
        paths.benchmark("evaluate/{model}/fold_{fold}")
    wildcard_constraints:
        model=DETERMINISTIC_MODELS,


rule baselines:
    input:
        manifest=paths.FEATURE_MANIFEST,
        folds=paths.FOLDS,
    output:
        metrics=paths.BASELINE_METRICS,
        bars=paths.BASELINE_BARS,
    log:
        paths.log("evaluate/baselines/fold_{fold}"),
    benchmark:
        paths.benchmark("evaluate/baselines/fold_{fold}")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("baselines"),
    params:
        config=stage_config("baselines"),
        code=code_hash("baselines"),
    script:
        "../workflow_scripts/baselines.py"
