{{/* The pod template of one role (router, prefill, decode): dict "root" $ "role" name. */}}

{{- define "pdserve.gpuResource" -}}
{{- $keys := dict "nvidia" "nvidia.com/gpu" "amd" "amd.com/gpu" "intel" "gpu.intel.com/i915" -}}
{{- index $keys . -}}
{{- end -}}

{{- define "pdserve.resources" -}}
{{- $pool := index .root.Values .role -}}
{{- $res := deepCopy $pool.resources -}}
{{- if and (ne .role "router") $pool.gpu.count -}}
{{- $limits := default (dict) $res.limits -}}
{{- $_ := set $limits (include "pdserve.gpuResource" $pool.gpu.vendor) (int $pool.gpu.count) -}}
{{- $_ := set $res "limits" $limits -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{- define "pdserve.ports" -}}
{{- $pool := index .root.Values .role -}}
{{- range $name, $port := $pool.ports }}
- name: {{ $name }}
  containerPort: {{ $port }}
  protocol: TCP
{{- end }}
{{- end -}}

{{/* The probes: workers answer grpc.health.v1 on their gRPC port ("" = the process serves,
     the role's service = ready for work; a drain turns only the latter NOT_SERVING); the
     router is ready when /health says it has workers, alive while its gRPC health answers. */}}
{{- define "pdserve.probes" -}}
{{- $pool := index .root.Values .role -}}
{{- $p := $pool.probes -}}
{{- $grpc := int $pool.ports.grpc -}}
{{- $service := ternary "pdserve.v1.PrefillWorker" "pdserve.v1.DecodeWorker" (eq .role "prefill") -}}
{{- $tls := ternary .root.Values.tls.router.existingSecret .root.Values.tls.internal.existingSecret (eq .role "router") -}}
{{- /* The kubelet's gRPC probe speaks no TLS: behind TLS, "alive" is an open port. */ -}}
{{- $alive := ternary (dict "tcpSocket" (dict "port" $grpc)) (dict "grpc" (dict "port" $grpc)) (not (empty $tls)) -}}
startupProbe:
  {{- toYaml $alive | nindent 2 }}
  {{- toYaml $p.startup | nindent 2 }}
readinessProbe:
{{- if eq .role "router" }}
  httpGet:
    path: /health
    port: http
    {{- if $tls }}
    scheme: HTTPS
    {{- end }}
{{- else if $tls }}
  tcpSocket:
    port: {{ $grpc }}
{{- else }}
  grpc:
    port: {{ $grpc }}
    service: {{ $service }}
{{- end }}
  {{- toYaml $p.readiness | nindent 2 }}
livenessProbe:
  {{- toYaml $alive | nindent 2 }}
  {{- toYaml $p.liveness | nindent 2 }}
{{- end -}}

{{- define "pdserve.env" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: HOME
  value: /var/cache/pdserve
- name: XDG_CACHE_HOME
  value: /var/cache/pdserve/.cache
- name: PDSERVE_CACHE
  value: /var/cache/pdserve
- name: HF_HOME
  value: /var/cache/pdserve/huggingface
- name: TRITON_CACHE_DIR
  value: /var/cache/pdserve/triton
- name: TMPDIR
  value: /tmp
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/* Secret volumes: name -> Secret, for the roles that read them. */}}
{{- define "pdserve.secretVolumes" -}}
{{- $v := .root.Values -}}
{{- $out := dict -}}
{{- if eq $v.controlPlane.mode "redis" -}}
{{- with $v.redis.auth.existingSecret }}{{ $_ := set $out "redis-auth" . }}{{ end -}}
{{- if $v.redis.tls.enabled }}{{ $_ := set $out "redis-tls" $v.redis.tls.existingSecret }}{{ end -}}
{{- end -}}
{{- with $v.tls.internal.existingSecret }}{{ $_ := set $out "internal-tls" . }}{{ end -}}
{{- if eq .role "router" -}}
{{- with $v.auth.apiKeys.existingSecret }}{{ $_ := set $out "api-keys" . }}{{ end -}}
{{- with $v.tls.router.existingSecret }}{{ $_ := set $out "router-tls" . }}{{ end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "pdserve.modelVolume" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ $m.pvc.claimName }}
    readOnly: true
{{- else if eq $m.source "image" }}
- name: model
  image:
    reference: {{ $m.image.reference }}
    pullPolicy: {{ $m.image.pullPolicy }}
{{- else if eq $m.source "huggingface" }}
{{- if eq $m.huggingface.storage.kind "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.huggingface.storage.claimName is required for storage.kind pvc" $m.huggingface.storage.claimName }}
{{- else }}
- name: model
  emptyDir:
    {{- with $m.huggingface.storage.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The init container that downloads a Hugging Face folder (the router: tokenizer and
     config only). */}}
{{- define "pdserve.downloadContainer" -}}
{{- $v := .root.Values -}}
{{- $hf := $v.model.huggingface -}}
- name: download-model
  image: {{ include "pdserve.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["hf", "download"]
  args:
    - {{ $hf.repo | quote }}
    - --revision
    - {{ $hf.revision | quote }}
    - --local-dir
    - {{ include "pdserve.modelPath" .root | quote }}
    {{- if eq .role "router" }}
    {{- range list "*.json" "*.txt" "*.model" "*.tiktoken" "*.jinja" }}
    - --include
    - {{ . | quote }}
    {{- end }}
    {{- end }}
  env:
    {{- include "pdserve.env" .root | nindent 4 }}
    - name: HF_HUB_DISABLE_TELEMETRY
      value: "1"
    {{- with $hf.tokenSecret.name }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: {{ $hf.tokenSecret.key }}
    {{- end }}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - {name: model, mountPath: /models}
    - {name: cache, mountPath: /var/cache/pdserve}
    - {name: tmp, mountPath: /tmp}
{{- end -}}

{{- define "pdserve.topologySpread" -}}
{{- $pool := index .root.Values .role -}}
{{- $ts := $pool.topologySpread -}}
{{- $out := list -}}
{{- if $ts.enabled -}}
{{- range $key := $ts.topologyKeys -}}
{{- $c := dict "maxSkew" (int $ts.maxSkew) "topologyKey" $key "whenUnsatisfiable" $ts.whenUnsatisfiable -}}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "pdserve.selectorLabels" $ | fromYaml)) -}}
{{- $_ := set $c "matchLabelKeys" (list "pod-template-hash") -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- end -}}
{{- $out = concat $out $pool.extraTopologySpreadConstraints -}}
{{- if $out }}
topologySpreadConstraints:
  {{- toYaml $out | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "pdserve.podTemplate" -}}
{{- $v := .root.Values -}}
{{- $pool := index $v .role -}}
{{- $secrets := include "pdserve.secretVolumes" . | fromYaml -}}
{{- $hasModel := has $v.model.source (list "pvc" "image" "huggingface") -}}
metadata:
  labels:
    {{- include "pdserve.labels" . | nindent 4 }}
    pdserve.io/model: {{ include "pdserve.modelName" .root | quote }}
    {{- with $pool.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $pool.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "pdserve.serviceAccountName" .root }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ add $v.drain.preStopSleepSeconds $v.drain.seconds 10 }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- with $v.image.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- with $pool.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $pool.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pool.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pool.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with include "pdserve.topologySpread" . | trim }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- if eq $v.model.source "huggingface" }}
  initContainers:
    {{- include "pdserve.downloadContainer" . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .role }}
      image: {{ include "pdserve.image" .root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      command: ["pdserve"]
      args:
        {{- if eq .role "router" }}
        {{- include "pdserve.args.router" .root | nindent 8 }}
        {{- else }}
        {{- include "pdserve.args.worker" . | nindent 8 }}
        {{- end }}
      env:
        {{- include "pdserve.env" .root | nindent 8 }}
        - name: HF_HUB_OFFLINE
          value: "1"
        {{- if ne .role "router" }}
        - name: OMP_NUM_THREADS
          valueFrom:
            resourceFieldRef:
              resource: limits.cpu
              divisor: "1"
        {{- end }}
        {{- with $pool.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        {{- include "pdserve.ports" . | trim | nindent 8 }}
      {{- include "pdserve.probes" . | nindent 6 }}
      lifecycle:
        preStop:
          sleep:
            seconds: {{ $v.drain.preStopSleepSeconds }}
      resources:
        {{- include "pdserve.resources" . | nindent 8 }}
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - {name: cache, mountPath: /var/cache/pdserve}
        - {name: tmp, mountPath: /tmp}
        {{- if $hasModel }}
        - {name: model, mountPath: /models, readOnly: true}
        {{- end }}
        {{- if and (ne .role "router") $pool.shmSizeLimit }}
        - {name: shm, mountPath: /dev/shm}
        {{- end }}
        {{- range $name, $_ := $secrets }}
        - {name: {{ $name }}, mountPath: {{ include "pdserve.secretDir" $name }}, readOnly: true}
        {{- end }}
        {{- with $pool.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: cache
      emptyDir: {}
    - name: tmp
      emptyDir: {}
    {{- with include "pdserve.modelVolume" .root | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- if and (ne .role "router") $pool.shmSizeLimit }}
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $pool.shmSizeLimit }}
    {{- end }}
    {{- range $name, $secret := $secrets }}
    - name: {{ $name }}
      secret:
        secretName: {{ $secret }}
    {{- end }}
    {{- with $pool.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
