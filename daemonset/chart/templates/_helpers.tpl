{{/* The prefix of every object name: the release name unless fullnameOverride. */}}
{{- define "hami-plugin.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami-plugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "hami-plugin.scheduler" -}}{{ include "hami-plugin.fullname" . }}-scheduler{{- end -}}
{{- define "hami-plugin.device-plugin" -}}{{ include "hami-plugin.fullname" . }}-device-plugin{{- end -}}
{{- define "hami-plugin.webhook" -}}{{ include "hami-plugin.fullname" . }}-webhook{{- end -}}
{{- define "hami-plugin.tls" -}}{{ include "hami-plugin.scheduler" . }}-tls{{- end -}}
{{- define "hami-plugin.certgen" -}}{{ include "hami-plugin.fullname" . }}-webhook-certgen{{- end -}}
{{/* The Lease `hami scheduler` elects its leader on (kube-scheduler's is schedulerName). */}}
{{- define "hami-plugin.extender-lease" -}}{{ include "hami-plugin.scheduler" . }}-extender{{- end -}}

{{/* Labels of every object; call with (dict "ctx" . "component" "scheduler"). */}}
{{- define "hami-plugin.labels" -}}
app.kubernetes.io/name: hami-plugin
app.kubernetes.io/part-of: hami-plugin
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version }}
{{- with .ctx.Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels a workload selects its pods by; same call as hami-plugin.labels. */}}
{{- define "hami-plugin.selectorLabels" -}}
app.kubernetes.io/name: hami-plugin
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of a workload's pods. */}}
{{- define "hami-plugin.podLabels" -}}
{{ include "hami-plugin.selectorLabels" . }}
app.kubernetes.io/part-of: hami-plugin
{{- end -}}

{{/* registry/repository:tag; call with (dict "image" .Values.x.image "ctx" . "tag" "default"). */}}
{{- define "hami-plugin.image" -}}
{{- $registry := default .image.registry .ctx.Values.global.imageRegistry -}}
{{- $tag := default .tag .image.tag -}}
{{- if $registry -}}
{{ $registry }}/{{ .image.repository }}:{{ $tag }}
{{- else -}}
{{ .image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{- define "hami-plugin.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The port `hami scheduler` serves filter/bind/webhook on, and its scheme. */}}
{{- define "hami-plugin.extender-port" -}}
{{- if .Values.scheduler.admissionWebhook.enabled -}}{{ .Values.scheduler.service.httpTargetPort }}{{- else -}}8080{{- end -}}
{{- end -}}

{{/* The metrics port, from scheduler.metricsBindAddress (":9395" -> 9395). */}}
{{- define "hami-plugin.scheduler-metrics-port" -}}
{{- last (splitList ":" .Values.scheduler.metricsBindAddress) | int -}}
{{- end -}}

{{/* HAMi's device config, read by both daemons (device-config.yaml). */}}
{{- define "hami-plugin.device-config" -}}
{{- if (index .Values "device-config" "content") -}}
{{ index .Values "device-config" "content" }}
{{- else -}}
nvidia:
  resourceCountName: {{ .Values.resourceName }}
  resourceMemoryName: {{ .Values.resourceMem }}
  resourceMemoryPercentageName: {{ .Values.resourceMemPercentage }}
  resourceCoreName: {{ .Values.resourceCores }}
  resourcePriorityName: {{ .Values.resourcePriority }}
  overwriteEnv: {{ .Values.scheduler.overwriteEnv | default "false" }}
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  preConfiguredDeviceMemory: {{ .Values.devicePlugin.preConfiguredDeviceMemory | default 0 }}
  memoryFactor: 1
  deviceSplitCount: {{ .Values.devicePlugin.deviceSplitCount }}
  deviceMemoryScaling: {{ .Values.devicePlugin.deviceMemoryScaling }}
  deviceCoreScaling: {{ .Values.devicePlugin.deviceCoreScaling }}
  enableNumaTopology: {{ .Values.devicePlugin.enableNumaTopology | default false }}
  gpuCorePolicy: {{ .Values.devices.nvidia.gpuCorePolicy }}
  libCudaLogLevel: {{ .Values.devices.nvidia.libCudaLogLevel }}
  runtimeClassName: {{ .Values.devicePlugin.runtimeClassName | quote }}
{{- end }}
{{- end -}}

{{/* The device plugin's socket, named after the resource as HAMi does (nvidia-gpu.sock). */}}
{{- define "hami-plugin.socket" -}}
{{ .Values.devicePlugin.pluginPath }}/nvidia-{{ last (splitList "/" .Values.resourceName) }}.sock
{{- end -}}
