{{/* Names, labels and the pieces every workload shares. */}}

{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of one role's objects: <fullname>-<role>. */}}
{{- define "pdserve.roleName" -}}
{{- printf "%s-%s" (include "pdserve.fullname" .root) .role -}}
{{- end -}}

{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{/* Selects every pod of this release (the NetworkPolicies' "own pods"). */}}
{{- define "pdserve.releaseSelector" -}}
app.kubernetes.io/name: {{ include "pdserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pdserve.labels" -}}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/part-of: pdserve
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* metadata: of an object of one role; optional: suffix (of the name), namespace, and
     labels and annotations added to the common ones. */}}
{{- define "pdserve.metadata" -}}
name: {{ include "pdserve.roleName" . }}{{ with .suffix }}-{{ . }}{{ end }}
namespace: {{ default .root.Release.Namespace .namespace }}
labels:
  {{- include "pdserve.labels" . | nindent 2 }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $annotations := merge (deepCopy (default (dict) .annotations)) .root.Values.commonAnnotations }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "pdserve.image" -}}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion .Values.image.flavor) .Values.image.tag -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{/* A Service's in-cluster DNS name. */}}
{{- define "pdserve.dns" -}}
{{- printf "%s.%s.svc.%s" (include "pdserve.roleName" .) .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end -}}

{{/* Where the model folder is inside every container ("" for the demo model). */}}
{{- define "pdserve.modelPath" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "path" -}}{{ $m.path }}
{{- else if eq $m.source "pvc" -}}{{ trimSuffix "/" (printf "/models/%s" $m.pvc.subPath) }}
{{- else if eq $m.source "image" -}}{{ trimSuffix "/" (printf "/models/%s" $m.image.subPath) }}
{{- else if eq $m.source "huggingface" -}}/models/{{ base $m.huggingface.repo }}
{{- end -}}
{{- end -}}

{{/* The served model name: what clients send, and every metric's model label. */}}
{{- define "pdserve.modelName" -}}
{{- $m := .Values.model -}}
{{- $name := $m.servedModelName -}}
{{- if not $name -}}
{{- if eq $m.source "demo" -}}{{- $name = "demo-llama-v1" -}}
{{- else -}}{{- $name = base (include "pdserve.modelPath" .) -}}
{{- end -}}
{{- end -}}
{{- if not (regexMatch "^([A-Za-z0-9][-A-Za-z0-9_.]{0,61}[A-Za-z0-9]|[A-Za-z0-9])$" $name) -}}
{{- fail (printf "model.servedModelName: %q (derived from the model's path) is not a valid label value; set model.servedModelName" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* Flags from a values object: key maxNumSeqs -> --max-num-seqs; true -> a bare switch;
     false and null -> nothing. Integral numbers print as integers. */}}
{{- define "pdserve.flags" -}}
{{- range $key, $value := . }}
{{- if kindIs "bool" $value }}
{{- if $value }}
- --{{ kebabcase $key }}
{{- end }}
{{- else if not (kindIs "invalid" $value) }}
- --{{ kebabcase $key }}
{{- if and (kindIs "float64" $value) (eq $value (floor $value)) }}
- {{ int64 $value | quote }}
{{- else }}
- {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
