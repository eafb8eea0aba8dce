{{/* Names and labels shared by the chart's templates. */}}

{{- define "slotune.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name when it already contains the chart name (`helm install slotune`). */}}
{{- define "slotune.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "slotune.operatorName" -}}
{{- printf "%s-operator" (include "slotune.fullname" .) }}
{{- end }}

{{- define "slotune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "slotune.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "slotune.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Labels that select the operator's pods; they never change across upgrades. */}}
{{- define "slotune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slotune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "slotune.labels" -}}
{{ include "slotune.selectorLabels" . }}
app.kubernetes.io/part-of: slotune
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* A list of strings as a CEL list literal: ['a', 'b']. Values are checked by values.schema.json (no quotes). */}}
{{- define "slotune.celList" -}}
[{{- range $i, $e := . }}{{ if $i }}, {{ end }}'{{ $e }}'{{ end }}]
{{- end }}

{{/* Flags the operator sets on the runtime: never accepted in spec.runtime.extraArgs. The same list as
operator/slotune/admission.py OPERATOR_FLAGS (tests/unit/test_chart_admission.py compares them). */}}
{{- define "slotune.operatorFlags" -}}
['--model', '--served-model-name', '--host', '--port', '--admin-port', '--uds', '--admin-token-file', '--device', '--dtype', '--max-model-len', '--revision', '--tensor-parallel-size', '-tp', '--config', '-q', '--slo-bucket-edges', '--max-num-seqs', '--max-num-batched-tokens', '--enable-chunked-prefill', '--no-enable-chunked-prefill', '--enable-prefix-caching', '--no-enable-prefix-caching', '--speculative-config', '--quantization', '--kv-cache-dtype']
{{- end }}
