{{/* Name of the chart, for labels. */}}
{{- define "tiergate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every object name. Kept to 45 characters so suffixes such as
"-dispatcher-metrics" still fit in 63.
*/}}
{{- define "tiergate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tiergate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "tiergate.labels" -}}
helm.sh/chart: {{ include "tiergate.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tiergate
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels. They do not follow nameOverride: a ModelPool's
spec.dispatchers.selector matches the dispatcher labels, so they must be
predictable.
*/}}
{{- define "tiergate.controller.selectorLabels" -}}
app.kubernetes.io/name: tiergate-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tiergate.dispatcher.selectorLabels" -}}
app.kubernetes.io/name: tiergate-dispatcher
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tiergate.controller.labels" -}}
{{ include "tiergate.labels" . }}
{{ include "tiergate.controller.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "tiergate.dispatcher.labels" -}}
{{ include "tiergate.labels" . }}
{{ include "tiergate.dispatcher.selectorLabels" . }}
app.kubernetes.io/component: dispatcher
{{- end }}

{{- define "tiergate.controller.serviceAccountName" -}}
{{- default (printf "%s-controller" (include "tiergate.fullname" .)) .Values.controller.serviceAccount.name }}
{{- end }}

{{- define "tiergate.dispatcher.serviceAccountName" -}}
{{- default (printf "%s-dispatcher" (include "tiergate.fullname" .)) .Values.dispatcher.serviceAccount.name }}
{{- end }}

{{- define "tiergate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "tiergate.pushToken.secretName" -}}
{{- default (printf "%s-push-token" (include "tiergate.fullname" .)) .Values.pushToken.existingSecret }}
{{- end }}

{{/* Where both roles find the push token. */}}
{{- define "tiergate.pushToken.dir" -}}/var/run/tiergate/push-token{{- end }}
{{- define "tiergate.pushToken.file" -}}{{ include "tiergate.pushToken.dir" . }}/token{{- end }}

{{- define "tiergate.pushToken.volume" -}}
- name: push-token
  secret:
    secretName: {{ include "tiergate.pushToken.secretName" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.pushToken.key }}
        path: token
{{- end }}

{{/*
"true" when the controller manages the push token Secret: it creates it,
with a random token, when it is missing.
*/}}
{{- define "tiergate.pushToken.managed" -}}
{{- and (not .Values.pushToken.existingSecret) (not .Values.pushToken.value) }}
{{- end }}

{{/*
The controller's token volume. When the controller creates the Secret the
volume is optional, or the controller's pod could not start to create it;
the kubelet fills it in once the Secret exists, and until then the
controller pushes with the token it created.
*/}}
{{- define "tiergate.pushToken.controllerVolume" -}}
{{ include "tiergate.pushToken.volume" . }}
{{- if eq (include "tiergate.pushToken.managed" .) "true" }}
    optional: true
{{- end }}
{{- end }}

{{- define "tiergate.pushToken.volumeMount" -}}
- name: push-token
  mountPath: {{ include "tiergate.pushToken.dir" . }}
  readOnly: true
{{- end }}

{{/* The --state flag: local, or a redis:// / rediss:// URL without the password. */}}
{{- define "tiergate.dispatcher.state" -}}
{{- if .Values.redis.enabled }}
{{- $user := "" }}
{{- if .Values.redis.username }}{{ $user = printf "%s@" (.Values.redis.username | urlquery) }}{{ end }}
{{- printf "%s://%s%s/%d" (ternary "rediss" "redis" .Values.redis.tls.enabled) $user .Values.redis.address (int .Values.redis.db) }}
{{- if .Values.redis.cluster }}?cluster=true{{ end }}
{{- else }}
{{- print "local" }}
{{- end }}
{{- end }}

{{- define "tiergate.redis.passwordDir" -}}/var/run/tiergate/redis{{- end }}
{{- define "tiergate.redis.caDir" -}}/var/run/tiergate/redis-ca{{- end }}
{{- define "tiergate.backend.caDir" -}}/var/run/tiergate/backend-ca{{- end }}

{{/* Cross-field checks the schema cannot express. */}}
{{- define "tiergate.validate" -}}
{{- $d := .Values.dispatcher }}
{{- if le (int $d.terminationGracePeriodSeconds) (add $d.preStopSleepSeconds $d.drainTimeoutSeconds | int) }}
{{- fail (printf "dispatcher.terminationGracePeriodSeconds (%d) must be greater than dispatcher.preStopSleepSeconds + dispatcher.drainTimeoutSeconds (%d), or in-flight requests are killed while draining" (int $d.terminationGracePeriodSeconds) (add $d.preStopSleepSeconds $d.drainTimeoutSeconds | int)) }}
{{- end }}
{{- if and $d.maxQueuedBytes (lt (int64 $d.maxQueuedBytes) (int64 (default 4194304 $d.maxBodyBytes))) }}
{{- fail (printf "dispatcher.maxQueuedBytes (%d) must be at least dispatcher.maxBodyBytes (%d), or a body of the largest size would never fit" (int64 $d.maxQueuedBytes) (int64 (default 4194304 $d.maxBodyBytes))) }}
{{- end }}
{{- if and $d.backend.tls.caSecret.name $d.backend.tls.caConfigMap.name }}
{{- fail "dispatcher.backend.tls: set caSecret or caConfigMap, not both: the dispatcher takes one CA file" }}
{{- end }}
{{- if eq (int $d.dataPort) (int $d.adminPort) }}
{{- fail (printf "dispatcher.dataPort and dispatcher.adminPort must differ (both are %d)" (int $d.dataPort)) }}
{{- end }}
{{- if and .Values.controller.enabled (eq (int .Values.controller.metricsPort) (int .Values.controller.healthPort)) }}
{{- fail (printf "controller.metricsPort and controller.healthPort must differ (both are %d)" (int .Values.controller.metricsPort)) }}
{{- end }}
{{- if and .Values.controller.enabled (gt (int .Values.controller.replicas) 1) (not .Values.controller.leaderElect) }}
{{- fail "controller.replicas greater than 1 needs controller.leaderElect: two active controllers would push conflicting policies" }}
{{- end }}
{{- if and .Values.redis.enabled (not .Values.redis.address) }}
{{- fail "redis.address is required when redis.enabled is true" }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- $rd := .Values.redis }}
{{- if and $rd.cluster (ne (int $rd.db) 0) }}
{{- fail (printf "redis.db (%d) must be 0 with redis.cluster: Redis Cluster has only database 0" (int $rd.db)) }}
{{- end }}
{{- if and $rd.tls.caSecret.name (not $rd.tls.enabled) }}
{{- fail "redis.tls.caSecret needs redis.tls.enabled: the dispatcher uses the CA only for rediss://" }}
{{- end }}
{{- /* The dispatcher refuses a TTL under 100ms and a renewal interval over half the TTL (default 10s). */}}
{{- $ttl := float64 $rd.leaseTTLSeconds }}
{{- if and (gt $ttl 0.0) (lt $ttl 0.1) }}
{{- fail (printf "redis.leaseTTLSeconds (%v) must be at least 0.1, or 0 for the dispatcher's default" $rd.leaseTTLSeconds) }}
{{- end }}
{{- if eq $ttl 0.0 }}{{ $ttl = 10.0 }}{{ end }}
{{- if gt (mulf (float64 $rd.renewIntervalSeconds) 2) $ttl }}
{{- fail (printf "redis.renewIntervalSeconds (%v) must be at most half the lease TTL (%vs)" $rd.renewIntervalSeconds $ttl) }}
{{- end }}
{{- end }}
{{- if and (not .Values.controller.enabled) .Values.networkPolicy.enabled (not .Values.networkPolicy.controllerPeer) }}
{{- fail "networkPolicy.controllerPeer is required when controller.enabled is false: otherwise no controller could push policies to these dispatchers" }}
{{- end }}
{{- if and (not .Values.controller.enabled) (not .Values.pushToken.existingSecret) }}
{{- fail "pushToken.existingSecret is required when controller.enabled is false: the dispatchers must share the token of the controller that pushes to them" }}
{{- end }}
{{- end }}

{{/* Labels of objects shared by both roles (the token Secret, the dashboard). */}}
{{- define "tiergate.shared.labels" -}}
{{ include "tiergate.labels" . }}
app.kubernetes.io/name: tiergate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* A PromQL selector from a list of label matchers; empty ones are left out. */}}
{{- define "tiergate.rule.sel" -}}
{{- $parts := list }}
{{- range . }}{{ if . }}{{ $parts = append $parts . }}{{ end }}{{ end }}
{{- printf "{%s}" (join "," $parts) }}
{{- end }}
