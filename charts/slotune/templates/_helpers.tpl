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
operator/slotune/manifests/admission.py OPERATOR_FLAGS (tests/unit/deploy/test_chart_admission.py compares them). */}}
{{- define "slotune.operatorFlags" -}}
['--model', '--served-model-name', '--host', '--port', '--admin-port', '--uds', '--admin-token-file', '--device', '--dtype', '--max-model-len', '--revision', '--tensor-parallel-size', '-tp', '--config', '-q', '--slo-bucket-edges', '--max-num-seqs', '--max-num-batched-tokens', '--enable-chunked-prefill', '--no-enable-chunked-prefill', '--enable-prefix-caching', '--no-enable-prefix-caching', '--speculative-config', '--quantization', '--kv-cache-dtype']
{{- end }}

{{/* What the operator does where TunedModels live: the same rules in a namespace's Role or in the ClusterRole.
Each rule names the code path that needs it; docs/security.md explains them. */}}
{{- define "slotune.namespacedRules" -}}
# kopf lists and watches TunedModels and patches their finalizer and progress; the status store reads one back.
- apiGroups: ["slotune.io"]
  resources: ["tunedmodels"]
  verbs: ["get", "list", "watch", "patch"]
# The status store (controller/status.py) and kopf's progress write the status with merge patches.
- apiGroups: ["slotune.io"]
  resources: ["tunedmodels/status"]
  verbs: ["patch"]
# The runtime Deployment: server-side apply (patch; create when it does not exist yet), read from a watch (list,
# watch; get before the watch has synced and for the canary Deployment), and the canary Deployment deleted.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The runtime Service and, where the Prometheus Operator is installed, its ServiceMonitor: server-side apply only.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["create", "patch"]
# The admin-token Secret: created once (a deleted one is created again: the rotation), read from a watch of the
# Secrets labelled managed-by=slotune (get before it has synced). Never updated, patched or deleted by the operator
# (the TunedModel's owner reference deletes it). RBAC cannot name NAME-admin-token for every NAME (resourceNames are
# exact names), so the namespaces are the bound: with watchNamespaces, only those.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create"]
# The runtime pods' NetworkPolicy (networkPolicy.create): server-side apply only.
{{- if .Values.networkPolicy.create }}
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
{{- end }}
# Runtime pods: listed by label to read each one's live config and readiness.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- if eq .Values.adminTransport "proxy" }}
# adminTransport: proxy: GET and POST /admin/config through the API server's pod proxy.
- apiGroups: [""]
  resources: ["pods/proxy"]
  verbs: ["get", "create"]
{{- end }}
# Events on TunedModels: slotune's own (controller/events.py) and kopf's warnings, posted (never patched).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
