{{/* Names and labels shared by every template. */}}

{{- define "cosyvoice-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cosyvoice-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cosyvoice-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cosyvoice-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cosyvoice-operator.labels" -}}
{{ include "cosyvoice-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: cosyvoice
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "cosyvoice-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cosyvoice-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "cosyvoice-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* True ("true") when the Prometheus Operator's API is served: monitors and rules are rendered only then. */}}
{{- define "cosyvoice-operator.hasPrometheusOperator" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- end -}}

{{/* The RBAC rules, generated from operator/cosyvoice_operator/permissions.py (python -m tools.sync_chart). */}}
{{- define "cosyvoice-operator.rules" -}}
{{- .Files.Get "files/rbac-rules.yaml" | fromYaml | toJson -}}
{{- end -}}

{{/* Where the metrics sources' Secrets are mounted in the operator pod (one folder per source). */}}
{{- define "cosyvoice-operator.metricsDir" -}}/etc/cosyvoice-operator/metrics{{- end -}}

{{/* The administrator's settings the operator reads (cosyvoice-operator run --config): metrics sources with
the paths of their mounted credentials, and the bounds. Parsed by cosyvoice_operator.admin. */}}
{{- define "cosyvoice-operator.config" -}}
{{- $dir := include "cosyvoice-operator.metricsDir" . -}}
{{- $sources := dict -}}
{{- range $name, $src := .Values.metricsSources -}}
{{- $out := dict "url" $src.url "insecureSkipVerify" (default false $src.insecureSkipVerify) "namespaces" (default list $src.namespaces) "allowQueryOverrides" (default false $src.allowQueryOverrides) -}}
{{- if $src.bearerTokenSecret -}}{{- $_ := set $out "bearerTokenFile" (printf "%s/%s/token" $dir $name) -}}{{- end -}}
{{- if $src.caSecret -}}{{- $_ := set $out "caFile" (printf "%s/%s/ca.crt" $dir $name) -}}{{- end -}}
{{- $_ := set $sources $name $out -}}
{{- end -}}
{{- $bounds := dict "allowedImageRegistries" .Values.bounds.allowedImageRegistries "requiredResourceLimits" .Values.bounds.requiredResourceLimits -}}
{{- range $key := list "allowedPriorityClasses" "allowedTolerationKeys" "allowedServiceTypes" "allowedMetadataPrefixes" -}}
{{- with index $.Values.bounds $key -}}{{- $_ := set $bounds $key . -}}{{- end -}}
{{- end -}}
{{- if .Values.bounds.maxReplicas -}}{{- $_ := set $bounds "maxReplicas" .Values.bounds.maxReplicas -}}{{- end -}}
{{- $config := dict "metricsSources" $sources "bounds" $bounds -}}
{{- if .Values.defaultMetricsSource -}}
{{- if not (hasKey .Values.metricsSources .Values.defaultMetricsSource) -}}
{{- fail (printf "defaultMetricsSource %q is not one of metricsSources" .Values.defaultMetricsSource) -}}
{{- end -}}
{{- $_ := set $config "defaultMetricsSource" .Values.defaultMetricsSource -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
