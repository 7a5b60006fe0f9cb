# The verdict's calibration (docs/METRICS.md, "Calibration"): not part of `all`; build it with
#   snakemake results/calibration/calibration.html
# Each job runs calibration.worlds_per_job synthetic worlds end to end and writes one chunk; the summary reads them all.


rule calibration_worlds:
    output:
        paths.CALIBRATION_CHUNK,
    log:
        paths.log("calibration/job_{job}"),
    benchmark:
        paths.benchmark("calibration/job_{job}")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("calibration_worlds"),
    params:
        config=stage_config("calibration_worlds"),
        code=code_hash("calibration_worlds"),
    script:
        "../workflow_scripts/calibration_worlds.py"


rule calibration:
    input:
        calibration_chunks(),
    output:
        json=paths.CALIBRATION_JSON,
        html=paths.CALIBRATION_HTML,
    log:
        paths.log("calibration/summary"),
    benchmark:
        paths.benchmark("calibration/summary")
    conda:
        ENV_FILE
    threads: 1
    resources:
        mem_mb=fixed_mem_mb("calibration"),
    params:
        config=stage_config("calibration"),
        code=code_hash("calibration"),
    script:
        "../workflow_scripts/calibration.py"
