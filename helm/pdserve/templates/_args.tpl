{{/* Each container's argv, built from values through pdserve's own flags. Flags marked
     PENDING are not in pdserve yet; they render only behind values documented as pending
     (docs/kubernetes.md lists them) and tests/helm/test_args.py pins that list. */}}

{{- define "pdserve.secretDir" -}}/var/run/secrets/pdserve/{{ . }}{{- end -}}

{{/* Redis connection flags: every role, in redis mode. */}}
{{- define "pdserve.args.redis" -}}
{{- $r := .Values.redis }}
- --redis-url
{{- if $r.deploy }}
- {{ printf "%s://%s:%d/0" (ternary "rediss" "redis" $r.tls.enabled) (include "pdserve.dns" (dict "root" . "role" "redis")) (int $r.port) | quote }}
{{- else }}
- {{ $r.external.url | quote }}
{{- end }}
{{- if $r.auth.existingSecret }}
- --redis-password-file
- {{ printf "%s/%s" (include "pdserve.secretDir" "redis-auth") $r.auth.passwordKey | quote }}
{{- end }}
{{- if $r.tls.enabled }}
- --redis-ca-file
- {{ printf "%s/ca.crt" (include "pdserve.secretDir" "redis-tls") | quote }}
{{- end }}
{{- end -}}

{{- define "pdserve.args.model" -}}
{{- $path := include "pdserve.modelPath" . -}}
{{- if $path }}
- --model
- {{ $path | quote }}
{{- end }}
- --served-model-name
- {{ include "pdserve.modelName" . | quote }}
{{- end -}}

{{- define "pdserve.args.router" -}}
{{- $v := .Values -}}
- router
- --host
- "0.0.0.0"
- --http-port
- {{ $v.router.ports.http | quote }}
- --grpc-port
- {{ $v.router.ports.grpc | quote }}
- --shutdown-grace-s
- {{ $v.drain.seconds | quote }}
{{- include "pdserve.args.model" . }}
{{- if eq $v.controlPlane.mode "static" }}
- --decode
- {{ printf "%s:%d" (include "pdserve.dns" (dict "root" . "role" "decode")) (int $v.decode.ports.grpc) | quote }}
- --prefill
- {{ printf "%s:%d" (include "pdserve.dns" (dict "root" . "role" "prefill")) (int $v.prefill.ports.grpc) | quote }}
{{- else }}
{{- include "pdserve.args.redis" . }}
{{- end }}
{{- include "pdserve.flags" (pick $v.engine "blockSize" "maxModelLen") }}
{{- include "pdserve.flags" $v.router.flags }}
{{- with $v.auth.apiKeys.existingSecret }}
- --api-key-file
- {{ printf "%s/%s" (include "pdserve.secretDir" "api-keys") $v.auth.apiKeys.key | quote }}
{{- end }}
{{- with $v.tls.router.existingSecret }}
- --tls-cert-file
- {{ printf "%s/tls.crt" (include "pdserve.secretDir" "router-tls") | quote }}
- --tls-key-file
- {{ printf "%s/tls.key" (include "pdserve.secretDir" "router-tls") | quote }}
{{- if $v.tls.router.verifyClients }}
- --tls-client-ca-file
- {{ printf "%s/ca.crt" (include "pdserve.secretDir" "router-tls") | quote }}
{{- end }}
{{- end }}
{{- with $v.tls.internal.existingSecret }}
- --worker-tls-ca-file
- {{ printf "%s/ca.crt" (include "pdserve.secretDir" "internal-tls") | quote }}
- --worker-tls-cert-file
- {{ printf "%s/tls.crt" (include "pdserve.secretDir" "internal-tls") | quote }}
- --worker-tls-key-file
- {{ printf "%s/tls.key" (include "pdserve.secretDir" "internal-tls") | quote }}
{{- with $v.tls.internal.serverName }}
- --worker-tls-server-name
- {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A worker's argv; .role is "prefill" or "decode". */}}
{{- define "pdserve.args.worker" -}}
{{- $v := .root.Values -}}
{{- $pool := index $v .role -}}
- {{ .role }}
- --host
- "$(POD_IP)"
- --port
- {{ $pool.ports.grpc | quote }}
- --metrics-port
- {{ $pool.ports.metrics | quote }}
{{- include "pdserve.args.model" .root }}
{{- if eq .role "decode" }}
- --kv-transport
- {{ $v.kvTransfer.transport | quote }}
- --kv-host
- "$(POD_IP)"
- --kv-port
- {{ $pool.ports.kv | quote }}
{{- end }}
{{- include "pdserve.flags" (mergeOverwrite (deepCopy $v.engine) $pool.flags) }}
{{- if eq $v.controlPlane.mode "redis" }}
{{- include "pdserve.args.redis" .root }}
- --worker-id
- "$(POD_NAME)"
{{- end }}
- --shutdown-grace-s
- {{ $v.drain.seconds | quote }}
{{- if and (eq .role "decode") (not (kindIs "invalid" $v.drain.migrateAfterSeconds)) }}
- --drain-migrate-after-s
- {{ $v.drain.migrateAfterSeconds | quote }}
{{- end }}
{{- with $v.tls.internal.existingSecret }}
{{- if ne $v.kvTransfer.transport "tcp" }}
{{- fail "tls.internal needs kvTransfer.transport tcp: UCX connections carry no certificate" }}
{{- end }}
- --tls-ca-file
- {{ printf "%s/ca.crt" (include "pdserve.secretDir" "internal-tls") | quote }}
- --tls-cert-file
- {{ printf "%s/tls.crt" (include "pdserve.secretDir" "internal-tls") | quote }}
- --tls-key-file
- {{ printf "%s/tls.key" (include "pdserve.secretDir" "internal-tls") | quote }}
{{- with $v.tls.internal.serverName }}
- --tls-server-name
- {{ . | quote }}
{{- end }}
{{- end }}
{{- if eq .role "prefill" }}
{{- range $v.kvTransfer.allowedPeers }}
- --kv-allowed-peers
- {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}
