{{/*
outboxd.fullname: the ConfigMap's and the Deployment's name, and the
Secret's by default. Every template here takes a context with .Values (this
chart's values) and .Release, so that a service's chart can call the
sidecar templates with (dict "Values" .Values.outboxd "Release" .Release).
*/}}
{{- define "outboxd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "outboxd" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-outboxd" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "outboxd.secretName" -}}
{{- .Values.secret.name | default (include "outboxd.fullname" .) -}}
{{- end -}}

{{- define "outboxd.selectorLabels" -}}
app.kubernetes.io/name: outboxd
app.kubernetes.io/instance: {{ include "outboxd.fullname" . }}
{{- end -}}

{{/* Object labels: the selector's, and Helm's own (not on pods). */}}
{{- define "outboxd.labels" -}}
{{ include "outboxd.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service | default "Helm" }}
helm.sh/chart: outboxd-{{ .Chart.Version | default "0" | replace "+" "_" }}
{{- end -}}

{{/*
outboxd.config: outboxd.yaml, from .Values.config with what the chart owns
set: pipeline.shutdown_timeout, health.listen and the secret files.
*/}}
{{- define "outboxd.config" -}}
{{- $c := deepCopy (.Values.config | default dict) -}}
{{- $s := .Values.secret -}}
{{- $dir := .Values.secretMountPath -}}
{{- $pg := get $c "postgres" | default dict -}}
{{- $pgTLS := get $pg "tls" | default dict -}}
{{- $k := get $c "kafka" | default dict -}}
{{- $kTLS := get $k "tls" | default dict -}}
{{- $sasl := get $k "sasl" | default dict -}}
{{- $tr := get $c "tracing" | default dict -}}
{{- $pipe := get $c "pipeline" | default dict -}}
{{- $health := get $c "health" | default dict -}}
{{- if hasKey $pg "password" }}{{ fail "config.postgres.password: put the password in the Secret and name its key in secret.postgresPassword" }}{{ end -}}
{{- if hasKey $sasl "password" }}{{ fail "config.kafka.sasl.password: put the password in the Secret and name its key in secret.kafkaSASLPassword" }}{{ end -}}
{{- if hasKey $pipe "shutdown_timeout" }}{{ fail "config.pipeline.shutdown_timeout: set shutdownTimeoutSeconds, from which the chart also derives the grace period" }}{{ end -}}
{{- if hasKey $health "listen" }}{{ fail "config.health.listen: set healthPort" }}{{ end -}}
{{- if hasKey $pipe "memory_limit" }}{{ fail "config.pipeline.memory_limit: GOMEMLIMIT is the container's memory limit; set resources.limits.memory" }}{{ end -}}
{{- $file := dict -}}
{{- range $key, $name := $s -}}
{{- if and $name (ne $key "name") }}{{ $_ := set $file $key (printf "%s/%s" $dir $name) }}{{ end -}}
{{- end -}}
{{- with $file.postgresPassword }}{{ $_ := set $pg "password_file" . }}{{ end -}}
{{- with $file.postgresCA }}{{ $_ := set $pgTLS "ca_file" . }}{{ end -}}
{{- with $file.postgresClientCert }}{{ $_ := set $pgTLS "cert_file" . }}{{ end -}}
{{- with $file.postgresClientKey }}{{ $_ := set $pgTLS "key_file" . }}{{ end -}}
{{- with $file.streamKey }}{{ $_ := set $k "stream_key_file" . }}{{ end -}}
{{- with $file.kafkaCA }}{{ $_ := set $kTLS "ca_file" . }}{{ end -}}
{{- with $file.kafkaClientCert }}{{ $_ := set $kTLS "cert_file" . }}{{ end -}}
{{- with $file.kafkaClientKey }}{{ $_ := set $kTLS "key_file" . }}{{ end -}}
{{- with $file.kafkaSASLPassword }}{{ $_ := set $sasl "password_file" . }}{{ end -}}
{{- with $file.tracingCA }}{{ $_ := set $tr "ca_file" . }}{{ end -}}
{{- if $pgTLS }}{{ $_ := set $pg "tls" $pgTLS }}{{ end -}}
{{- if $kTLS }}{{ $_ := set $k "tls" $kTLS }}{{ end -}}
{{- if $sasl }}{{ $_ := set $k "sasl" $sasl }}{{ end -}}
{{- if $tr }}{{ $_ := set $c "tracing" $tr }}{{ end -}}
{{- $_ := set $c "postgres" $pg -}}
{{- $_ := set $c "kafka" $k -}}
{{- $_ := set $pipe "shutdown_timeout" (printf "%ds" (int .Values.shutdownTimeoutSeconds)) -}}
{{- $_ := set $c "pipeline" $pipe -}}
{{- $_ := set $health "listen" (printf "0.0.0.0:%d" (int .Values.healthPort)) -}}
{{- $_ := set $c "health" $health -}}
{{- toYaml $c -}}
{{- end -}}

{{/*
outboxd.container: the outboxd container; .sidecar true for the native
sidecar (restartPolicy: Always, readiness on /healthz: a sidecar's readiness
is the pod's, and must not depend on Kafka), false for the single instance
(readiness on /readyz).
*/}}
{{- define "outboxd.container" -}}
{{- $sidecar := .sidecar -}}
{{- with .ctx -}}
- name: outboxd
  image: {{ printf "%s:%s" .Values.image.repository (toString .Values.image.tag) | quote }}
  {{- with .Values.image.pullPolicy }}
  imagePullPolicy: {{ . }}
  {{- end }}
  {{- if $sidecar }}
  restartPolicy: Always
  {{- end }}
  # A slot outboxd had seen and finds missing exits 3 at every start
  # (docs/operations.md#a-dropped-slot): the pod crash-loops until the
  # operator runs outboxd slot forget.
  args: ["run", "-c", "/etc/outboxd/outboxd.yaml"]
  env:
    # The Go runtime collects harder as it nears the memory limit rather
    # than being OOM-killed at it.
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef:
          containerName: outboxd
          resource: limits.memory
  ports:
    - name: outboxd-health
      containerPort: {{ int .Values.healthPort }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: outboxd-health
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 6
  readinessProbe:
    httpGet:
      path: {{ if $sidecar }}/healthz{{ else }}/readyz{{ end }}
      port: outboxd-health
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 3
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    runAsUser: 65532
    runAsGroup: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true # outboxd writes only its spill files, in the emptyDir at /tmp
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: outboxd-config
      mountPath: /etc/outboxd
      readOnly: true
    - name: outboxd-secrets
      mountPath: {{ .Values.secretMountPath }}
      readOnly: true
    # A streamed transaction's outbox changes wait here for its commit
    # (postgres.streaming; pipeline.spill_dir defaults to /tmp).
    - name: outboxd-spill
      mountPath: /tmp
{{- end -}}
{{- end -}}

{{/*
outboxd.sidecar: the native sidecar, an entry of the pod's initContainers.
In a service's chart that has this chart as a dependency:
  initContainers:
    {{- include "outboxd.sidecar" (dict "Values" .Values.outboxd "Release" .Release) | nindent 8 }}
*/}}
{{- define "outboxd.sidecar" -}}
{{ include "outboxd.container" (dict "ctx" . "sidecar" true) }}
{{- end -}}

{{/* outboxd.sidecarVolumes: the entries of the pod's volumes the sidecar mounts. */}}
{{- define "outboxd.sidecarVolumes" -}}
- name: outboxd-config
  configMap:
    name: {{ include "outboxd.fullname" . }}
    items:
      - key: outboxd.yaml
        path: outboxd.yaml
- name: outboxd-secrets
  secret:
    secretName: {{ include "outboxd.secretName" . }}
    defaultMode: 0440 # read by the group fsGroup gives the volume
- name: outboxd-spill
  emptyDir:
    sizeLimit: {{ .Values.spillSizeLimit }}
{{- end -}}

{{/*
outboxd.podAnnotations: the configuration's checksum, so that an upgrade
that changes the configuration replaces the pod (outboxd reads it at start).
*/}}
{{- define "outboxd.podAnnotations" -}}
checksum/config: {{ include "outboxd.config" . | sha256sum }}
{{- end -}}

{{/* outboxd.podLabels: the label the PodMonitor selects. */}}
{{- define "outboxd.podLabels" -}}
outboxd: "true"
{{- end -}}

{{/*
outboxd.terminationGracePeriodSeconds: above pipeline.shutdown_timeout (a
SIGKILL at the end of the grace period turns a clean stop into a crash).
outboxd.sidecarTerminationGracePeriodSeconds: the same plus the service's
own shutdown, which comes first.
*/}}
{{- define "outboxd.terminationGracePeriodSeconds" -}}
{{- add (int .Values.shutdownTimeoutSeconds) (int .Values.terminationGraceMarginSeconds) -}}
{{- end -}}

{{- define "outboxd.sidecarTerminationGracePeriodSeconds" -}}
{{- add (include "outboxd.terminationGracePeriodSeconds" . | int) (int .Values.sidecar.serviceShutdownSeconds) -}}
{{- end -}}

{{/* outboxd.podSecurityContext: what the pod needs for outboxd (the fsGroup reads the Secret's files). */}}
{{- define "outboxd.podSecurityContext" -}}
runAsNonRoot: true
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
outboxd.networkPolicyIngress: the ingress rule that lets Prometheus reach
the health port, and nothing else: for the chart's NetworkPolicy, and for
a service's own NetworkPolicy when outboxd is its sidecar (the service's
pod is selected; its own ports need rules of their own there).
*/}}
{{- define "outboxd.networkPolicyIngress" -}}
- from:
    {{- toYaml .Values.networkPolicy.prometheus | nindent 4 }}
  ports:
    - protocol: TCP
      port: {{ .Values.healthPort }}
{{- end -}}
