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

{{/* The repair account: repair.serviceAccount.name, else <fullname>-repair, so two releases in one namespace do not
share (and uninstall) one account. */}}
{{- define "bookfleet.repairAccount" -}}
{{- .Values.repair.serviceAccount.name | default (printf "%s-repair" (include "bookfleet.fullname" .) | trunc 63 | trimSuffix "-") -}}
{{- end -}}

{{/* The ZooKeeper credential's Secret: security.zookeeperAuth.secretName, else <fullname>-zk-auth (unique per
release). A release installed when the name was fixed keeps bookfleet-zk-auth: its fleet's ZooKeeper nodes are
locked with the credential in it. */}}
{{- define "bookfleet.zkAuthSecret" -}}
{{- $legacy := lookup "v1" "Secret" (include "bookfleet.watchNamespace" .) "bookfleet-zk-auth" -}}
{{- $legacyRelease := "" -}}
{{- if $legacy -}}
{{- $legacyRelease = index ($legacy.metadata.labels | default dict) "app.kubernetes.io/instance" | default "" -}}
{{- end -}}
{{- if .Values.security.zookeeperAuth.secretName -}}
{{- .Values.security.zookeeperAuth.secretName -}}
{{- else if eq $legacyRelease .Release.Name -}}
bookfleet-zk-auth
{{- else -}}
{{- printf "%s-zk-auth" (include "bookfleet.fullname" .) | trunc 63 | trimSuffix "-" -}}
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

{{/* ZooKeeper of the chart's BookieCluster: bookieCluster.zookeeper, else the chart's ensemble. */}}
{{- define "bookfleet.clusterZookeeper" -}}
{{- .Values.bookieCluster.zookeeper | default (include "bookfleet.zookeeperConnect" .) -}}
{{- end -}}

{{/* The chart's BookieCluster's client certificates (a YAML list): security.clientCertificates and, with TLS,
the one `helm test` presents. */}}
{{- define "bookfleet.clientCertificates" -}}
{{- $names := .Values.security.clientCertificates -}}
{{- if and (ne .Values.security.tls "Disabled") .Values.test.clientCertificate -}}
{{- $names = append $names .Values.test.clientCertificate | uniq -}}
{{- end -}}
{{- toYaml $names -}}
{{- end -}}

{{/* NetworkPolicy peers of the fleet: its own pods (bookies, operator, repair drivers and executors) and pods
labelled `bookfleet.io/client: "true"` (bookfleet.kube.resources.CLIENT_LABEL, which the operator's bookie policies
allow too), in the release namespace and in the watched one, and networkPolicy.clients (the chart's BookieCluster
admits them on its bookie port too). */}}
{{- define "bookfleet.fleetPeers" -}}
{{- $namespaces := uniq (list .Release.Namespace (include "bookfleet.watchNamespace" .)) -}}
{{- range $namespace := $namespaces }}
{{- range $labels := list (dict "app.kubernetes.io/name" (include "bookfleet.name" $)) (dict "bookfleet.io/client" "true") }}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ $namespace }}
  podSelector:
    matchLabels:
      {{- toYaml $labels | nindent 6 }}
{{- end }}
{{- end }}
{{- with .Values.networkPolicy.clients }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of every bookie pod and of each cluster's headless Service (bookfleet.kube.resources.BOOKIE_POD_SELECTOR). */}}
{{- define "bookfleet.bookieSelector" -}}
app.kubernetes.io/name: bookfleet
app.kubernetes.io/component: bookie
{{- end -}}
