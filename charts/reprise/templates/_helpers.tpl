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

{{/*
Image reference: "repository@digest" when a digest is set (the tag is then
not used: a digest names one image, a tag may move), else
"repository:tag", the tag defaulting to the chart's appVersion. Call with
(list . .Values.image.controller).
*/}}
{{- define "reprise.image" -}}
{{- $img := index . 1 }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default (index . 0).Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{/*
Pod placement and pull secrets: imagePullSecrets (the chart's, for every
pod it runs), nodeSelector and tolerations from the component's values.
Call with (list . .Values.controller); trim it and use with nindent. Affinity and
priorityClassName are left to each pod: the controller has a default
affinity, the helm test pod takes no priority.
*/}}
{{- define "reprise.placement" -}}
{{- $root := index . 0 }}
{{- $v := index . 1 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
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

{{/*
What values.schema.json cannot say clearly (its errors for these name no
field or the wrong one): pod label keys the chart's selectors use, the
annotation that rolls the controller, and environment variables the chart
sets itself (a second entry of one name would be ambiguous, and breaks
strategic-merge upgrades). Fails naming the value; renders nothing.
*/}}
{{- define "reprise.validate" -}}
{{- $ownLabels := list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/part-of" }}
{{- range $component := list "controller" "jaeger" }}
{{- range $key, $_ := (index $.Values $component).podLabels }}
{{- if has $key $ownLabels }}
{{- fail (printf "%s.podLabels: %q is one of the chart's own labels (its selectors use them); choose another key" $component $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasKey .Values.controller.podAnnotations "checksum/injection" }}
{{- fail "controller.podAnnotations: \"checksum/injection\" is the chart's (it rolls the controller when the injection config changes); choose another key" }}
{{- end }}
{{- $chartEnv := dict "POD_NAME" "the downward API" "POD_NAMESPACE" "the downward API" "NODE_NAME" "the downward API" "REPRISE_LOG" "controller.logLevel" "OTEL_EXPORTER_OTLP_ENDPOINT" "otel.endpoint" "OTEL_EXPORTER_OTLP_PROTOCOL" "otel.protocol" "OTEL_TRACES_SAMPLER" "otel.sampler" "OTEL_TRACES_SAMPLER_ARG" "otel.samplerArg" "OTEL_SERVICE_NAME" "the chart" "OTEL_RESOURCE_ATTRIBUTES" "the downward API" "OTEL_EXPORTER_OTLP_COMPRESSION" "otel.compression" "OTEL_EXPORTER_OTLP_CERTIFICATE" "otel.tls.caSecret" "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE" "otel.tls.clientSecret" "OTEL_EXPORTER_OTLP_CLIENT_KEY" "otel.tls.clientSecret" }}
{{- $seen := dict }}
{{- range $i, $e := .Values.controller.extraEnv }}
{{- if hasKey $chartEnv $e.name }}
{{- fail (printf "controller.extraEnv[%d]: %s is set by the chart (from %s)" $i $e.name (get $chartEnv $e.name)) }}
{{- end }}
{{- if hasKey $seen $e.name }}
{{- fail (printf "controller.extraEnv[%d]: %s is named twice" $i $e.name) }}
{{- end }}
{{- $_ := set $seen $e.name true }}
{{- if and (hasKey $e "value") (hasKey $e "valueFrom") }}
{{- fail (printf "controller.extraEnv[%d]: %s has both value and valueFrom; give one" $i $e.name) }}
{{- end }}
{{- end }}
{{- end }}
