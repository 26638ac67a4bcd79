{{/* A role's Deployment: dict "root" $ "role" name. An autoscaler, when on, owns replicas. */}}
{{- define "pdserve.deployment" -}}
{{- $pool := index .root.Values .role -}}
{{- $scaled := or $pool.autoscaling.hpa.enabled $pool.autoscaling.keda.enabled -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  {{- include "pdserve.metadata" . | nindent 2 }}
spec:
  {{- if not $scaled }}
  replicas: {{ $pool.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  {{- with $pool.strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "pdserve.selectorLabels" . | nindent 6 }}
  template:
    {{- include "pdserve.podTemplate" . | nindent 4 }}
{{- end -}}

{{/* A worker pool's headless Service: one DNS record per ready pod, for gRPC, KV and
     metrics (the router and the registry address pods, never a virtual IP). */}}
{{- define "pdserve.workerService" -}}
{{- $pool := index .root.Values .role -}}
apiVersion: v1
kind: Service
metadata:
  {{- include "pdserve.metadata" . | nindent 2 }}
spec:
  clusterIP: None
  selector:
    {{- include "pdserve.selectorLabels" . | nindent 4 }}
  ports:
    {{- range $name, $port := $pool.ports }}
    - name: {{ $name }}
      port: {{ $port }}
      targetPort: {{ $name }}
      protocol: TCP
    {{- end }}
{{- end -}}
