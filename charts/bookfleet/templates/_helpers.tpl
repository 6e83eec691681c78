{{/* Chart name, truncated to a DNS label. */}}
{{- define "bookfleet.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name for the operator's objects. */}}
{{- define "bookfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The namespace the operator watches. */}}
{{- define "bookfleet.watchNamespace" -}}
{{- .Values.operator.watchNamespace | default .Release.Namespace -}}
{{- end -}}

{{- define "bookfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bookfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bookfleet.labels" -}}
{{ include "bookfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "bookfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "bookfleet.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* image reference: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "bookfleet.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .chart.AppVersion) -}}
{{- end -}}

{{- define "bookfleet.zookeeperName" -}}
{{- printf "%s-zookeeper" (include "bookfleet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Connect string of the chart's ZooKeeper ensemble. */}}
{{- define "bookfleet.zookeeperConnect" -}}
{{- $name := include "bookfleet.zookeeperName" . -}}
{{- printf "%s.%s.svc:2181" $name .Release.Namespace -}}
{{- end -}}
