{{/* Standard names and labels (helm create's conventions). */}}

{{- define "servebench.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "servebench.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "servebench.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "servebench.selectorLabels" -}}
app.kubernetes.io/name: {{ include "servebench.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "servebench.labels" -}}
helm.sh/chart: {{ include "servebench.chart" . }}
{{ include "servebench.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of one component: include "servebench.componentLabels" (list . "web") */}}
{{- define "servebench.componentLabels" -}}
{{ include "servebench.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "servebench.componentSelector" -}}
{{ include "servebench.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "servebench.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "servebench.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "servebench.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "servebench.runnerImage" -}}
{{- printf "%s:%s" .Values.runner.image.repository (default .Chart.AppVersion .Values.runner.image.tag) }}
{{- end }}

{{- define "servebench.runnerServiceAccountName" -}}
{{- if .Values.runner.serviceAccountName }}
{{- .Values.runner.serviceAccountName }}
{{- else if and .Values.rbac.create (eq .Values.runner.serverPlacement "separate") }}
{{- printf "%s-runner" (include "servebench.fullname" .) }}
{{- end }}
{{- end }}

{{- define "servebench.runnerNamespace" -}}
{{- default .Release.Namespace .Values.runner.namespace }}
{{- end }}

{{- define "servebench.secretName" -}}
{{- default (include "servebench.fullname" .) .Values.existingSecret }}
{{- end }}

{{- define "servebench.webService" -}}
{{- printf "%s-web" (include "servebench.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The web Service's in-cluster DNS name: what runners report to and probes send as Host. */}}
{{- define "servebench.webHost" -}}
{{- printf "%s.%s.svc" (include "servebench.webService" .) .Release.Namespace }}
{{- end }}

{{- define "servebench.publicHost" -}}
{{- (urlParse .Values.publicUrl).hostname }}
{{- end }}

{{- define "servebench.runnerPullSecrets" -}}
{{- $names := list }}
{{- range .Values.runner.imagePullSecrets }}
{{- $names = append $names .name }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{- define "servebench.hfCacheClaim" -}}
{{- if .Values.runner.hfCache.existingClaim }}
{{- .Values.runner.hfCache.existingClaim }}
{{- else if .Values.runner.hfCache.create }}
{{- printf "%s-hf-cache" (include "servebench.fullname" .) }}
{{- end }}
{{- end }}

{{/* runner.kueue.userQueueNames as USER=QUEUE,... (SERVEBENCH_K8S_KUEUE_USER_QUEUES). */}}
{{- define "servebench.userQueues" -}}
{{- $pairs := list }}
{{- range $user, $queue := .Values.runner.kueue.userQueueNames }}
{{- $pairs = append $pairs (printf "%s=%s" $user $queue) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* The samples PVC's name (samples.storage filesystem), else empty. */}}
{{- define "servebench.samplesClaim" -}}
{{- if eq .Values.samples.storage "filesystem" }}
{{- default (printf "%s-samples" (include "servebench.fullname" .)) .Values.samples.persistence.existingClaim }}
{{- end }}
{{- end }}

{{/*
"true" when the web pods must share one node: their samples volume is not ReadWriteMany,
so a pod on another node could never attach it (and a rollout would hang on it).
*/}}
{{- define "servebench.webOnOneNode" -}}
{{- if and (include "servebench.samplesClaim" .) (not (has "ReadWriteMany" .Values.samples.persistence.accessModes)) }}true{{ end }}
{{- end }}

{{/*
The label of web pods that mount the samples volume: what the one-node rule follows, so
that pods of a release from before the volume (on any node) do not count.
*/}}
{{- define "servebench.samplesPodLabel" -}}
servebench.dev/samples-volume: "true"
{{- end }}

{{/* web.affinity, plus the podAffinity that keeps web pods on one node when they must. */}}
{{- define "servebench.webAffinity" -}}
{{- $affinity := deepCopy .Values.web.affinity }}
{{- if include "servebench.webOnOneNode" . }}
{{- $podAffinity := deepCopy (default dict $affinity.podAffinity) }}
{{- $required := default list $podAffinity.requiredDuringSchedulingIgnoredDuringExecution }}
{{- $selector := fromYaml (include "servebench.componentSelector" (list . "web")) }}
{{- $selector = merge $selector (fromYaml (include "servebench.samplesPodLabel" .)) }}
{{- $term := dict "labelSelector" (dict "matchLabels" $selector) "topologyKey" "kubernetes.io/hostname" }}
{{- $_ := set $podAffinity "requiredDuringSchedulingIgnoredDuringExecution" (append $required $term) }}
{{- $_ := set $affinity "podAffinity" $podAffinity }}
{{- end }}
{{- with $affinity }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
The portal's settings (portal/settings.py) as a flat map: the ConfigMap's data, and the
migration hook's env (a pre-install hook runs before the ConfigMap exists).
*/}}
{{- define "servebench.config" -}}
{{- $runner := .Values.runner -}}
SERVEBENCH_PUBLIC_URL: {{ .Values.publicUrl | quote }}
ALLOWED_HOSTS: {{ join "," (concat (list (include "servebench.publicHost" .) (include "servebench.webService" .) (include "servebench.webHost" .) (printf "%s.cluster.local" (include "servebench.webHost" .))) .Values.allowedHosts) | quote }}
SERVEBENCH_BEHIND_TLS_PROXY: {{ .Values.behindTlsProxy | quote }}
SERVEBENCH_LOG_LEVEL: {{ .Values.logLevel | quote }}
SERVEBENCH_QUEUE: {{ .Values.queue | quote }}
SERVEBENCH_PAGE_CACHE: {{ .Values.pageCache | quote }}
SERVEBENCH_HOME: "/tmp/servebench"
SERVEBENCH_DATA_DIR: "/tmp/servebench/data"
SERVEBENCH_SAMPLES_STORAGE: {{ .Values.samples.storage | quote }}
{{- if eq .Values.samples.storage "s3" }}
SERVEBENCH_S3_BUCKET: {{ .Values.samples.s3.bucket | quote }}
SERVEBENCH_S3_ENDPOINT_URL: {{ .Values.samples.s3.endpointUrl | quote }}
SERVEBENCH_S3_REGION: {{ .Values.samples.s3.region | quote }}
SERVEBENCH_S3_PREFIX: {{ .Values.samples.s3.prefix | quote }}
{{- else }}
SERVEBENCH_SAMPLES_DIR: {{ .Values.samples.persistence.mountPath | quote }}
{{- end }}
SERVEBENCH_EXECUTOR: "kubernetes"
SERVEBENCH_K8S_NAMESPACE: {{ include "servebench.runnerNamespace" . | quote }}
SERVEBENCH_K8S_RUNNER_IMAGE: {{ include "servebench.runnerImage" . | quote }}
SERVEBENCH_K8S_IMAGE_PULL_POLICY: {{ $runner.image.pullPolicy | quote }}
SERVEBENCH_K8S_IMAGE_PULL_SECRETS: {{ include "servebench.runnerPullSecrets" . | quote }}
SERVEBENCH_K8S_RUNNER_SERVICE_ACCOUNT: {{ include "servebench.runnerServiceAccountName" . | quote }}
SERVEBENCH_K8S_SERVER_PLACEMENT: {{ $runner.serverPlacement | quote }}
SERVEBENCH_K8S_CLIENT_CPU_REQUEST: {{ $runner.clientResources.cpu | quote }}
SERVEBENCH_K8S_CLIENT_MEMORY_REQUEST: {{ $runner.clientResources.memory | quote }}
SERVEBENCH_K8S_LOADGEN_CPU_REQUEST: {{ $runner.loadgenResources.cpu | quote }}
SERVEBENCH_K8S_LOADGEN_MEMORY_REQUEST: {{ $runner.loadgenResources.memory | quote }}
SERVEBENCH_K8S_RUNNER_API_URL: {{ $runner.kubeApiUrl | quote }}
SERVEBENCH_K8S_GPU_RESOURCE: {{ $runner.gpu.resourceName | quote }}
SERVEBENCH_K8S_GPU_TYPE_LABEL: {{ $runner.gpu.typeLabel | quote }}
SERVEBENCH_K8S_MAX_GPUS: {{ $runner.gpu.maxCount | quote }}
SERVEBENCH_K8S_CPU_REQUEST: {{ $runner.resources.cpu | quote }}
SERVEBENCH_K8S_MEMORY_REQUEST: {{ $runner.resources.memory | quote }}
SERVEBENCH_K8S_SHM_SIZE: {{ $runner.shmSize | quote }}
SERVEBENCH_K8S_SHM_PER_GPU: {{ $runner.shmSizePerGpu | quote }}
SERVEBENCH_K8S_SHM_MAX: {{ $runner.shmSizeMax | quote }}
SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES: {{ join "," $runner.gpu.allowedResourceNames | quote }}
SERVEBENCH_K8S_KUEUE_QUEUE: {{ $runner.kueue.queueName | quote }}
SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES: {{ join "," $runner.kueue.allowedQueueNames | quote }}
SERVEBENCH_K8S_KUEUE_USER_QUEUES: {{ include "servebench.userQueues" . | quote }}
SERVEBENCH_K8S_PRIORITY_CLASS: {{ $runner.priorityClassName | quote }}
SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES: {{ join "," $runner.allowedPriorityClassNames | quote }}
SERVEBENCH_K8S_RUNTIME_CLASS: {{ $runner.runtimeClassName | quote }}
SERVEBENCH_K8S_NODE_SELECTOR: {{ $runner.nodeSelector | toJson | quote }}
SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS: {{ join "," $runner.allowedNodeSelectorKeys | quote }}
SERVEBENCH_GPU_TYPES: {{ join "," $runner.gpu.types | quote }}
SERVEBENCH_MODEL_ROOTS: {{ join "," $runner.modelRoots | quote }}
SERVEBENCH_DATASET_ROOTS: {{ join "," $runner.datasetRoots | quote }}
SERVEBENCH_K8S_TOLERATIONS: {{ $runner.tolerations | toJson | quote }}
SERVEBENCH_K8S_AFFINITY: {{ $runner.affinity | toJson | quote }}
SERVEBENCH_K8S_HF_CACHE_PVC: {{ include "servebench.hfCacheClaim" . | quote }}
SERVEBENCH_K8S_HF_HOME: {{ $runner.hfCache.mountPath | quote }}
SERVEBENCH_K8S_HF_TOKEN_SECRET: {{ $runner.hfToken.secretName | quote }}
SERVEBENCH_K8S_HF_TOKEN_KEY: {{ $runner.hfToken.key | quote }}
SERVEBENCH_K8S_TTL_SECONDS: {{ $runner.ttlSecondsAfterFinished | quote }}
SERVEBENCH_K8S_START_GRACE_SECONDS: {{ $runner.startGraceSeconds | quote }}
SERVEBENCH_K8S_REPORT_URL: {{ default (printf "http://%s:%v" (include "servebench.webHost" .) .Values.web.service.port) $runner.reportUrl | quote }}
{{- range $key, $value := .Values.extraEnv }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/*
Django's SECRET_KEY: the value given, else the one already installed, else a new random
one (so an upgrade never rotates it by surprise).
*/}}
{{- define "servebench.secretKey" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "servebench.fullname" .) }}
{{- if .Values.secrets.secretKey }}
{{- .Values.secrets.secretKey }}
{{- else if and $existing $existing.data (hasKey $existing.data "SECRET_KEY") }}
{{- index $existing.data "SECRET_KEY" | b64dec }}
{{- else }}
{{- randAlphaNum 50 }}
{{- end }}
{{- end }}

{{/* The Secret's data (also the migration hook's own copy before the Secret exists). */}}
{{- define "servebench.secretData" -}}
SECRET_KEY: {{ include "servebench.secretKey" . | b64enc | quote }}
DATABASE_URL: {{ .Values.secrets.databaseUrl | b64enc | quote }}
REDIS_URL: {{ .Values.secrets.redisUrl | b64enc | quote }}
{{- if .Values.secrets.tokenKey }}
SERVEBENCH_TOKEN_KEY: {{ .Values.secrets.tokenKey | b64enc | quote }}
{{- end }}
{{- if .Values.secrets.awsAccessKeyId }}
AWS_ACCESS_KEY_ID: {{ .Values.secrets.awsAccessKeyId | b64enc | quote }}
{{- end }}
{{- if .Values.secrets.awsSecretAccessKey }}
AWS_SECRET_ACCESS_KEY: {{ .Values.secrets.awsSecretAccessKey | b64enc | quote }}
{{- end }}
{{- if .Values.metrics.enabled }}
SERVEBENCH_METRICS_TOKEN: {{ include "servebench.metricsToken" . | b64enc | quote }}
{{- end }}
{{- end }}

{{/*
The /metrics bearer token: the value given, else the one already installed, else a new
random one (as the SECRET_KEY).
*/}}
{{- define "servebench.metricsToken" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "servebench.fullname" .) }}
{{- if .Values.metrics.token }}
{{- .Values.metrics.token }}
{{- else if and $existing $existing.data (hasKey $existing.data "SERVEBENCH_METRICS_TOKEN") }}
{{- index $existing.data "SERVEBENCH_METRICS_TOKEN" | b64dec }}
{{- else }}
{{- randAlphaNum 40 }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by the portal's pods. */}}
{{- define "servebench.podCommon" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
enableServiceLinks: false
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The portal container's environment: settings and secrets. */}}
{{- define "servebench.envFrom" -}}
envFrom:
  - configMapRef:
      name: {{ include "servebench.fullname" . }}
  - secretRef:
      name: {{ include "servebench.secretName" . }}
{{- end }}

{{/* Restarts pods when their settings change. */}}
{{- define "servebench.checksums" -}}
checksum/config: {{ include "servebench.config" . | sha256sum }}
{{- if not .Values.existingSecret }}
{{- with .Values.secrets }}
checksum/secret: {{ printf "%s|%s|%s|%s|%s|%s" .secretKey .databaseUrl .redisUrl .tokenKey .awsAccessKeyId .awsSecretAccessKey | sha256sum }}
{{- end }}
{{- if .Values.metrics.enabled }}
checksum/metrics: {{ .Values.metrics.token | sha256sum }}
{{- end }}
{{- end }}
{{- end }}
