{{/* The release's full name: the release name, prefixed with the chart's unless it holds it. */}}
{{- define "vllm-oncall.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vllm-oncall.labels" -}}
app.kubernetes.io/name: vllm-oncall
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: vllm-oncall
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The bot's pods: what the Service, NetworkPolicy and PodDisruptionBudget select. */}}
{{- define "vllm-oncall.selector" -}}
app.kubernetes.io/name: vllm-oncall
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: bot
{{- end -}}

{{- define "vllm-oncall.serviceAccountName" -}}
{{- default (include "vllm-oncall.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The Secret the bot reads: yours (slack.existingSecret), else the release's own. */}}
{{- define "vllm-oncall.slackSecret" -}}
{{- default (printf "%s-slack" (include "vllm-oncall.fullname" .)) .Values.slack.existingSecret -}}
{{- end -}}

{{- define "vllm-oncall.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Settings that cannot work together stop the install with one line naming the value (each value's
     own shape, e.g. mode's two choices, is values.schema.json's). */}}
{{- define "vllm-oncall.validate" -}}
{{- if and (eq .Values.mode "approve") (not .Values.approvers) (not .Values.approverGroups) -}}
{{- fail "approvers or approverGroups: approve mode needs at least one Slack user id (U…) or user group id (S…), e.g. --set approvers='{U0123ALICE}'" -}}
{{- end -}}
{{- range .Values.approvers -}}
{{- if not (regexMatch "^[UW][A-Z0-9]+$" .) -}}
{{- fail (printf "approvers: Slack user ids look like U0123ALICE (a U or W, then capitals and digits), not %q" .) -}}
{{- end -}}
{{- end -}}
{{- range .Values.approverGroups -}}
{{- if not (regexMatch "^S[A-Z0-9]+$" .) -}}
{{- fail (printf "approverGroups: Slack user group ids look like S0123ONCALL, not %q" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.slack.botToken .Values.slack.existingSecret -}}
{{- fail "slack.botToken and slack.existingSecret: set one (the chart creates the Secret from the tokens, or reads yours)" -}}
{{- end -}}
{{- if .Values.slack.botToken -}}
{{- if not .Values.slack.channel -}}
{{- fail "slack.channel: the alert channel's id (C…, in the channel's About tab) is required with slack.botToken" -}}
{{- end -}}
{{- if not (or .Values.slack.appToken .Values.slack.signingSecret) -}}
{{- fail "slack.appToken (Socket Mode, xapp-…) or slack.signingSecret (HTTP mode) is required with slack.botToken" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.clusters (not (hasKey .Values.clusters .Values.cluster)) -}}
{{- fail (printf "cluster: the default cluster must be one of clusters (%s), not %q" (keys .Values.clusters | sortAlpha | join ", ") .Values.cluster) -}}
{{- end -}}
{{- if and .Values.clusters (not .Values.kubeconfigSecret) -}}
{{- fail "kubeconfigSecret: with clusters, name the Secret holding the kubeconfig (key config) with every context" -}}
{{- end -}}
{{- end -}}
