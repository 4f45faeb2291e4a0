"""mqfed's data pipeline: the PySpark delivery audit over trace records (docs/traces.md).

Pure parts: `schema` (record schema), `metrics` (metric definitions as DataFrame transforms),
`verdict` and `report` (from aggregated figures). Adapters: `source` (reading traces),
`session` (the SparkSession), `charts` (PNG files), `job` (Parquet, report, summary).
Scripts: `submit` (spark-submit entry), `synthetic` (a trace with known faults) and
`measure` (time and peak memory of an audit).
"""
