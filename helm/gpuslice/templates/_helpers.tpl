{{/* Names and labels shared by every component. */}}
{{- define "gpuslice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "gpuslice.labels" -}}
app.kubernetes.io/name: gpuslice
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "gpuslice.selector" -}}
app.kubernetes.io/name: gpuslice
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuslice.image" -}}
image: {{ printf "%s:%s" .repository .tag | quote }}
imagePullPolicy: {{ .pullPolicy | default "IfNotPresent" }}
{{- end -}}

{{/* The "restricted" pod security profile: non-root, no escalation, no capabilities, seccomp. */}}
{{- define "gpuslice.podSecurity" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
fsGroup: 1000
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuslice.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "gpuslice.operator" -}}
{{- if eq (toString .Values.monitoring.operator) "auto" -}}
{{- .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}
{{- else -}}
{{- .Values.monitoring.operator -}}
{{- end -}}
{{- end -}}

{{- define "gpuslice.scrape" -}}
{{- if and .root.Values.monitoring.scrapeAnnotations (ne (include "gpuslice.operator" .root) "true") }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: {{ .path | quote }}
{{- end }}
{{- end -}}

{{/* Companion mode (hub.enabled: false): the names a Zero to JupyterHub release gives its objects
(its templates/_helpers-names.tpl: fullnameOverride "" gives "hub", "proxy-public"; null gives
"<release>-jupyterhub-hub", or "<release>-hub" when the release name contains "jupyterhub"). */}}
{{- define "gpuslice.z2jhPrefix" -}}
{{- $override := .Values.z2jh.fullnameOverride -}}
{{- if eq (typeOf $override) "string" -}}
{{- if $override }}{{ $override }}-{{ end -}}
{{- else if contains "jupyterhub" .Values.z2jh.releaseName -}}
{{ .Values.z2jh.releaseName }}-
{{- else -}}
{{ .Values.z2jh.releaseName }}-jupyterhub-
{{- end -}}
{{- end -}}

{{/* The hub's Service and Secret: this chart's, or z2jh's in companion mode. */}}
{{- define "gpuslice.hubName" -}}
{{- if .Values.hub.enabled -}}{{ include "gpuslice.fullname" . }}-hub{{- else -}}{{ include "gpuslice.z2jhPrefix" . }}hub{{- end -}}
{{- end -}}

{{- define "gpuslice.hubServiceAccount" -}}
{{- if .Values.hub.enabled -}}{{ include "gpuslice.fullname" . }}-hub{{- else -}}{{ .Values.z2jh.hubServiceAccount | default (include "gpuslice.hubName" .) }}{{- end -}}
{{- end -}}
