{{/* The voice store claim's name: <service name>-voices, within the 63 characters of a label value. */}}
{{- define "cosyvoice-service.voiceStoreName" -}}
{{- printf "%s-voices" (default .Release.Name .Values.name | trunc 56 | trimSuffix "-") -}}
{{- end -}}
