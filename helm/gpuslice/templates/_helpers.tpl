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

{{/*
monitoring.oncall checked before it is rendered into the hub ConfigMap: a webhook URL usually
carries a token, so it comes from the Secret existingSecret (webhook_url_key, deadman_url_key),
never from a value. Renders nothing; fails with what to do.
*/}}
{{- define "gpuslice.oncallChecked" -}}
{{- $oncall := .Values.monitoring.oncall | default dict -}}
{{- $contacts := list -}}
{{- range $i, $c := ($oncall.rotation | default list) -}}
{{- $contacts = append $contacts (dict "where" (printf "rotation[%d]" $i) "contact" $c) -}}
{{- end -}}
{{- range $tier := list "second_line" "owner" -}}
{{- with (get $oncall $tier) -}}
{{- $contacts = append $contacts (dict "where" $tier "contact" .) -}}
{{- end -}}
{{- end -}}
{{- $keys := list -}}
{{- range $contacts -}}
{{- if hasKey .contact "webhook_url" -}}
{{- fail (printf "monitoring.oncall.%s.webhook_url: a webhook URL would land in the hub ConfigMap; put it in a Secret (kubectl create secret generic gpuslice-oncall --from-literal=%s=https://...), set monitoring.oncall.existingSecret to its name and give webhook_url_key: %s (docs/operations.md)" .where (.contact.name | default "KEY") (.contact.name | default "KEY")) -}}
{{- end -}}
{{- with .contact.webhook_url_key -}}{{- $keys = append $keys . -}}{{- end -}}
{{- end -}}
{{- if hasKey $oncall "deadman_url" -}}
{{- fail "monitoring.oncall.deadman_url: the dead man's switch URL would land in the hub ConfigMap; put it in the Secret monitoring.oncall.existingSecret and give deadman_url_key (docs/operations.md)" -}}
{{- end -}}
{{- with $oncall.deadman_url_key -}}{{- $keys = append $keys . -}}{{- end -}}
{{- if hasKey $oncall "smtp_auth_password" -}}
{{- fail "monitoring.oncall.smtp_auth_password: the relay password would land in the hub ConfigMap; put it in the Secret monitoring.oncall.existingSecret and give smtp_auth_password_key (docs/operations.md)" -}}
{{- end -}}
{{- with $oncall.smtp_auth_password_key -}}{{- $keys = append $keys . -}}{{- end -}}
{{- if and $keys (not $oncall.existingSecret) -}}
{{- fail (printf "monitoring.oncall: the keys %s name webhook URLs in a Secret: set monitoring.oncall.existingSecret to the name of the Secret that holds them" (join ", " $keys)) -}}
{{- end -}}
{{- end -}}

{{/* The pod that runs `gpuslice oncall-config`: the hub, or the portal in companion mode. */}}
{{- define "gpuslice.oncallPod" -}}
{{- if .Values.monitoring.oncall.existingSecret -}}{{ if .Values.hub.enabled }}hub{{ else }}portal{{ end }}{{- end -}}
{{- end -}}

{{- define "gpuslice.oncallMount" -}}
- {name: oncall, mountPath: /etc/gpuslice-oncall, readOnly: true}  # hub/kube_values.py ONCALL_SECRET_DIR
{{- end -}}

{{- define "gpuslice.oncallVolume" -}}
- name: oncall  # the webhook URLs: files readable by the pod's group only, never environment variables
  secret: {secretName: {{ .Values.monitoring.oncall.existingSecret | quote }}, defaultMode: 288}  # 0440
{{- end -}}

{{/* The incident recorder runs (a container of the portal's pod) when asked for and an Alertmanager is named: "true" or "". */}}
{{- define "gpuslice.recorderOn" -}}
{{- if and .Values.portal.enabled .Values.monitoring.incidentRecorder.enabled .Values.monitoring.alertmanagerUrl -}}true{{- end -}}
{{- end -}}

{{/*
A memory size in GiB from "40GiB", "40Gi", "512MiB", "1TiB" (binary units, as group budgets are written):
  {{ include "gpuslice.gib" "40GiB" }} -> 40
*/}}
{{- define "gpuslice.gib" -}}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexFind "[A-Za-z]+$" . | trimSuffix "B" -}}
{{- if eq $unit "Mi" }}{{ divf $n 1024 }}{{ else if eq $unit "Ti" }}{{ mulf $n 1024 }}{{ else }}{{ $n }}{{ end -}}
{{- end }}
