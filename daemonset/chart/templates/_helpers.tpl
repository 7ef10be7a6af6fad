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
{{/* The Service of every scheduler replica (the webhook), the name the serving certificate
carries; and the Service of the leading replica (the extender, metrics). */}}
{{- define "hami-plugin.extender-service" -}}{{ include "hami-plugin.scheduler" . }}-extender{{- end -}}
{{/* The Secrets `hami certs` (or cert-manager) writes; see daemonset/certs.yaml. */}}
{{- define "hami-plugin.tls" -}}{{ include "hami-plugin.scheduler" . }}-tls{{- end -}}
{{- define "hami-plugin.ca" -}}{{ include "hami-plugin.scheduler" . }}-ca{{- end -}}
{{- define "hami-plugin.client-tls" -}}{{ include "hami-plugin.fullname" . }}-kube-scheduler-client{{- end -}}
{{- /* The scheduler's Ed25519 private booking keys (the scheduler mounts it), their public
keys (the device plugins mount it), and the HMAC key of the scheme before (verify only, while
it exists: the upgrade window). */}}
{{- define "hami-plugin.booking-key" -}}{{ include "hami-plugin.fullname" . }}-booking-signing-key{{- end -}}
{{- define "hami-plugin.booking-public-keys" -}}{{ include "hami-plugin.fullname" . }}-booking-public-keys{{- end -}}
{{- define "hami-plugin.booking-legacy-key" -}}{{ include "hami-plugin.fullname" . }}-booking-key{{- end -}}
{{- define "hami-plugin.certs" -}}{{ include "hami-plugin.fullname" . }}-certs{{- end -}}
{{/* The DNS names of the serving certificate (`hami certs --service`, cert-manager's dnsNames). */}}
{{- define "hami-plugin.dns-names" -}}
{{- $service := include "hami-plugin.scheduler" . -}}
{{- $namespace := include "hami-plugin.namespace" . -}}
{{- list $service (printf "%s.%s" $service $namespace) (printf "%s.%s.svc" $service $namespace) (printf "%s.%s.svc.%s" $service $namespace .Values.clusterDomain) | toJson -}}
{{- end -}}
{{/* "true" when the ValidatingAdmissionPolicies are rendered: admissionPolicy.enabled, or with
"auto" a cluster of 1.30 or newer (the v1 API; the node name in service account tokens). */}}
{{- define "hami-plugin.admission-policy" -}}
{{- $enabled := toString .Values.admissionPolicy.enabled -}}
{{- if eq $enabled "auto" -}}
{{- semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version -}}
{{- else if has $enabled (list "true" "false") -}}
{{- eq $enabled "true" -}}
{{- else -}}
{{- fail (printf "admissionPolicy.enabled is %q: auto, true or false" $enabled) -}}
{{- end -}}
{{- end -}}
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

{{/* The hami-plugin image of every pod the chart runs: `image`, the one place to change it. */}}
{{- define "hami-plugin.own-image" -}}
{{- include "hami-plugin.image" (dict "image" .Values.image "ctx" . "tag" .Chart.AppVersion) -}}
{{- end -}}

{{/* kube-scheduler's tag: scheduler.kubeScheduler.image.tag, else the cluster's version cut to
vMAJOR.MINOR.PATCH, which is what registry.k8s.io tags (HAMi's strippedKubeVersion does the
same): distributions report v1.30.2+k3s1, v1.30.5-eks-ce1d5eb, v1.29.8-gke.1211000. */}}
{{- define "hami-plugin.kube-scheduler-tag" -}}
{{- $release := regexFind "^v[0-9]+[.][0-9]+[.][0-9]+" .Capabilities.KubeVersion.Version -}}
{{- default $release .Values.scheduler.kubeScheduler.image.tag -}}
{{- end -}}

{{/* The host directory of HAMi-core, <global.gpuHookPath>/vgpu, mounted at the same path (the
device plugin hands kubelet host paths under it). HAMi's chart mounts devicePlugin.libPath
there, which breaks when the two differ: here libPath may only repeat it. */}}
{{- define "hami-plugin.vgpu-dir" -}}
{{- $dir := printf "%s/vgpu" (trimSuffix "/" .Values.global.gpuHookPath) -}}
{{- with .Values.devicePlugin.libPath -}}
{{- if ne (trimSuffix "/" .) $dir -}}
{{- fail (printf "devicePlugin.libPath %q must be global.gpuHookPath/vgpu (%s): the device plugin hands kubelet host paths under the hook path; set global.gpuHookPath instead" . $dir) -}}
{{- end -}}
{{- end -}}
{{- $dir -}}
{{- end -}}

{{- define "hami-plugin.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
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
  # Dynamic MIG (a node's `operatingmode: mig`): the profiles each model may be split into,
  # HAMi v2.10's list (charts/hami/templates/scheduler/device-configmap.yaml).
  migProfileAllowlist:
  - models: [ "A30" ]
    profiles: [ "1g.6gb", "2g.12gb", "4g.24gb" ]
  - models: [ "A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"]
    profiles: [ "1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb" ]
  - models: [ "A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"]
    profiles: [ "1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb" ]
  - models: [ "H100-PCIE-80GB", "H100-SXM5-80GB"]
    profiles: [ "1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb" ]
  - models: [ "H100-PCIE-94GB", "H100-SXM5-94GB"]
    profiles: [ "1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb" ]
  - models: [ "H20", "H100 on GH200"]
    profiles: [ "1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb" ]
  - models: [ "H200 NVL", "H200-SXM5"]
    profiles: [ "1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb" ]
  - models: [ "B200" ]
    profiles: [ "1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb" ]
  - models: [ "RTX PRO 6000 Blackwell Server Edition" ]
    profiles: [ "1g.24gb", "2g.48gb", "4g.96gb" ]
{{- end }}
{{- end -}}

{{/* The device plugin's socket, named after the resource as HAMi does (nvidia-gpu.sock). */}}
{{- define "hami-plugin.socket" -}}
{{ .Values.devicePlugin.pluginPath }}/nvidia-{{ last (splitList "/" .Values.resourceName) }}.sock
{{- end -}}

{{/* The pod template of `hami certs` (the hook Job and the CronJob); call with
(dict "ctx" . "account" "<ServiceAccount>"). Flags at their defaults are left out, as in
daemonset/certs.yaml. */}}
{{- define "hami-plugin.certs-pod" -}}
{{- $ctx := .ctx -}}
{{- $patch := $ctx.Values.scheduler.patch -}}
metadata:
  labels:
    {{- include "hami-plugin.podLabels" (dict "ctx" $ctx "component" "certs") | nindent 4 }}
    hami.io/webhook: ignore
  {{- with $patch.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ .account }}
  restartPolicy: OnFailure
  {{- with $patch.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- include "hami-plugin.imagePullSecrets" $ctx | nindent 2 }}
  {{- with $patch.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $patch.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ $patch.runAsUser }}
    runAsGroup: {{ $patch.runAsUser }}
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: certs
      image: {{ include "hami-plugin.own-image" $ctx }}
      imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
      args:
        - certs
        - --namespace={{ include "hami-plugin.namespace" $ctx }}
        - --service={{ include "hami-plugin.scheduler" $ctx }}
        {{- /* "": no webhook configuration to patch */}}
        - --webhook-configuration={{ if $ctx.Values.scheduler.admissionWebhook.enabled }}{{ include "hami-plugin.webhook" $ctx }}{{ end }}
        - --renew-before={{ $patch.renewBefore }}
        {{- with $patch.validity }}
        - --validity={{ . }}
        {{- end }}
        {{- if ne $ctx.Values.clusterDomain "cluster.local" }}
        - --cluster-domain={{ $ctx.Values.clusterDomain }}
        {{- end }}
        {{- if ne (include "hami-plugin.fullname" $ctx) "hami" }}
        - --ca-secret={{ include "hami-plugin.ca" $ctx }}
        - --tls-secret={{ include "hami-plugin.tls" $ctx }}
        - --client-secret={{ include "hami-plugin.client-tls" $ctx }}
        - --booking-key-secret={{ include "hami-plugin.booking-key" $ctx }}
        - --booking-public-key-secret={{ include "hami-plugin.booking-public-keys" $ctx }}
        {{- end }}
        {{- if $ctx.Values.scheduler.certManager.enabled }}
        - --booking-keys-only
        {{- end }}
      resources:
        {{- toYaml $patch.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
{{- end -}}
