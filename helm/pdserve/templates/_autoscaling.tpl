{{/* The metrics each pool may scale on. Every name is a metric pdserve exports or one of the
     recording rules in rules/recording.yaml (tests/helm checks both). pods: a per-pod
     series, averaged over the pool (target per pod); external: one release-wide series,
     compared with the target as a value. */}}
{{- define "pdserve.scalingMetrics" -}}
router:
  inflightRequests: {scope: pods, name: pdserve_router_inflight_requests, labels: {role: router}, target: 64}
  cpu: {scope: resource, name: cpu, target: 70}
prefill:
  waitingRequests: {scope: pods, name: pdserve_engine_requests, labels: {role: prefill, state: waiting}, target: 4}
  prefillQueueP95: {scope: external, name: "pdserve:prefill_queue_seconds:p95_5m", target: 0.5}
  ttftP95: {scope: external, name: "pdserve:request_ttft_seconds:p95_5m", target: 1}
decode:
  kvUsage: {scope: pods, name: pdserve_engine_kv_usage_ratio, labels: {role: decode}, target: 0.7}
  itlP95: {scope: external, name: "pdserve:request_inter_token_latency_seconds:p95_5m", target: 0.05}
{{- end -}}

{{/* dict "root" $ "role" name -> the chosen metric with its target filled in. */}}
{{- define "pdserve.scalingMetric" -}}
{{- $as := (index .root.Values .role).autoscaling -}}
{{- $m := index (include "pdserve.scalingMetrics" . | fromYaml) .role $as.metric -}}
{{- if not (kindIs "invalid" $as.target) }}{{ $_ := set $m "target" $as.target }}{{ end -}}
{{- toYaml $m -}}
{{- end -}}

{{/* The PromQL KEDA runs: the metric of this release's namespace and model. */}}
{{- define "pdserve.scalingQuery" -}}
{{- $m := include "pdserve.scalingMetric" . | fromYaml -}}
{{- $labels := dict "namespace" .root.Release.Namespace "model" (include "pdserve.modelName" .root) -}}
{{- $labels = merge $labels (default (dict) $m.labels) -}}
{{- $matchers := list -}}
{{- range $k, $v := $labels }}{{ $matchers = append $matchers (printf "%s=%q" $k $v) }}{{ end -}}
{{- printf "%s(%s{%s})" (ternary "sum" "max" (eq $m.scope "pods")) $m.name (join "," $matchers) -}}
{{- end -}}
