"""pdserve's Helm chart values, as a typed model (``values``) derived where it can be from
pdserve's own flags (``flags``): ``python -m pdserve.chart`` writes the chart's
``values.schema.json`` and ``values.yaml`` and the values reference in docs/kubernetes.md;
``--check`` fails when any of them is stale (tests/helm runs it)."""
