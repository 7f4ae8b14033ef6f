{{/* Chart name, overridable with nameOverride. */}}
{{- define "reprise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, at most 63 characters. With the release name
"reprise" (or any release name containing the chart name) it is the release
name itself, so the controller Service is "reprise-controller".
*/}}
{{- define "reprise.fullname" -}}
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

{{/* "<fullname>-<suffix>", kept within 63 characters. Call with (list . "suffix"). */}}
{{- define "reprise.suffixed" -}}
{{- printf "%s-%s" (include "reprise.fullname" (index . 0)) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Controller Deployment, Service, ServiceAccount and RBAC name. */}}
{{- define "reprise.controllerName" -}}
{{- include "reprise.suffixed" (list . "controller") }}
{{- end }}

{{/* MutatingWebhookConfiguration name. */}}
{{- define "reprise.webhookName" -}}
{{- include "reprise.suffixed" (list . "sidecar-injector") }}
{{- end }}

{{/* Secret the controller keeps its generated CA and serving certificate in. */}}
{{- define "reprise.tlsSecretName" -}}
{{- include "reprise.suffixed" (list . "tls") }}
{{- end }}

{{/* cert-manager Certificate for the controller, and its Secret. */}}
{{- define "reprise.certificateName" -}}
{{- include "reprise.suffixed" (list . "webhook") }}
{{- end }}
{{- define "reprise.certificateSecretName" -}}
{{- include "reprise.suffixed" (list . "webhook-tls") }}
{{- end }}

{{/* Bundled Jaeger Deployment and Service name. */}}
{{- define "reprise.jaegerName" -}}
{{- include "reprise.suffixed" (list . "jaeger") }}
{{- end }}

{{/* In-cluster DNS name of the controller Service. */}}
{{- define "reprise.serviceHost" -}}
{{- printf "%s.%s.svc" (include "reprise.controllerName" .) .Release.Namespace }}
{{- end }}

{{/* Lease the controller replicas elect a leader with (fixed in the controller). */}}
{{- define "reprise.leaseName" -}}
reprise-controller
{{- end }}

{{/* Chart label value. */}}
{{- define "reprise.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels. Call with (list . "component"). */}}
{{- define "reprise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reprise.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Standard labels. Call with (list . "component"). */}}
{{- define "reprise.labels" -}}
helm.sh/chart: {{ include "reprise.chart" (index . 0) }}
{{ include "reprise.selectorLabels" . }}
app.kubernetes.io/version: {{ (index . 0).Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ (index . 0).Release.Service }}
app.kubernetes.io/part-of: reprise
{{- end }}

{{/* image reference "repository:tag"; tag defaults to the chart's appVersion. Call with (list . .Values.image.controller). */}}
{{- define "reprise.image" -}}
{{- $img := index . 1 }}
{{- printf "%s:%s" $img.repository (default (index . 0).Chart.AppVersion $img.tag) }}
{{- end }}

{{/*
OTLP endpoint for the controller and the sidecars: otel.endpoint when set,
else the bundled Jaeger when enabled (4317 for grpc, 4318 for http/protobuf),
else empty (tracing off).
*/}}
{{- define "reprise.otelEndpoint" -}}
{{- if .Values.otel.endpoint }}
{{- .Values.otel.endpoint }}
{{- else if .Values.jaeger.enabled }}
{{- printf "http://%s.%s.svc:%s" (include "reprise.jaegerName" .) .Release.Namespace (ternary "4317" "4318" (eq .Values.otel.protocol "grpc")) }}
{{- end }}
{{- end }}

{{/* Pod-level hardened security context. */}}
{{- define "reprise.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level hardened security context. */}}
{{- define "reprise.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
A resources map ({requests: {...}, limits: {...}}) as YAML with every
quantity a string, so a bare number (cpu: 1) stays a quantity. Use with
nindent.
*/}}
{{- define "reprise.quantities" -}}
{{- $out := dict }}
{{- range $kind, $quantities := . }}
{{- $q := dict }}
{{- range $resource, $quantity := $quantities }}
{{- $_ := set $q $resource ($quantity | toString) }}
{{- end }}
{{- $_ := set $out $kind $q }}
{{- end }}
{{- toYaml $out }}
{{- end }}
