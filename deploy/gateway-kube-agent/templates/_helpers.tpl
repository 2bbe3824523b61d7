{{/* The agent's name: the release name (the updater, Secrets and RBAC derive theirs from it). */}}
{{- define "gateway-kube-agent.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gateway-kube-agent.selectorLabels" -}}
app.kubernetes.io/name: gateway-kube-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gateway-kube-agent.labels" -}}
{{ include "gateway-kube-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gateway-kube-agent.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gateway-kube-agent.updaterImage" -}}
{{ .Values.updater.image.repository | default .Values.image.repository }}:{{ .Values.updater.image.tag | default .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The release's group in a managed rollout: updater.group, else the release's name (its dots as "-": Helm allows them
in a release's name) cut to 32 characters. Checked here,
so that a bad value fails the install rather than an agent's start.
*/}}
{{- define "gateway-kube-agent.upgradeGroup" -}}
{{- $group := .Values.updater.group | default (.Release.Name | replace "." "-" | trunc 32 | trimSuffix "-") -}}
{{- if not (regexMatch "^[a-z0-9-]{1,32}$" $group) -}}
{{- fail (printf "updater.group must be 1 to 32 characters of a-z, 0-9 and \"-\", not %q" $group) -}}
{{- end -}}
{{- $group -}}
{{- end -}}

{{/* The Secret the agent exports its maintenance schedule to, and the updater reads. */}}
{{- define "gateway-kube-agent.sharedState" -}}
{{ include "gateway-kube-agent.fullname" . }}-shared-state
{{- end -}}

{{- define "gateway-kube-agent.tokenSecret" -}}
{{ .Values.joinTokenSecret | default (printf "%s-join-token" (include "gateway-kube-agent.fullname" .)) }}
{{- end -}}

{{/* The agent's pod template, shared by the StatefulSet and the Deployment. */}}
{{- define "gateway-kube-agent.drainLimitSeconds" -}}
{{- $d := .Values.drainLimitSeconds -}}
{{- /* A number from values.yaml is a float64, one from --set an int64; a string or a fraction is refused. */ -}}
{{- if not (and (or (kindIs "float64" $d) (kindIs "int64" $d) (kindIs "int" $d)) (eq (float64 (int $d)) (float64 $d)) (gt (int $d) 0)) -}}
{{- fail (printf "drainLimitSeconds must be a whole number of seconds above 0, not %v" $d) -}}
{{- end -}}
{{- int $d -}}
{{- end }}

{{- define "gateway-kube-agent.podTemplate" -}}
metadata:
  labels:
    {{- include "gateway-kube-agent.selectorLabels" . | nindent 4 }}
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/config.yaml") . | sha256sum }}
    {{- with .Values.annotations.pod }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "gateway-kube-agent.fullname" . }}
  # SIGTERM drains the sessions in flight for drainLimitSeconds; a minute more to close what is left.
  terminationGracePeriodSeconds: {{ add (include "gateway-kube-agent.drainLimitSeconds" . | int) 60 }}
  containers:
    - name: gateway
      image: {{ include "gateway-kube-agent.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - start
        - -c
        - /etc/gateway/gateway.yaml
        - --token=$(GATEWAY_JOIN_TOKEN)
        - --ca-pin={{ required "caPin is required (gwctl tokens add prints it)" .Values.caPin }}
        - --proxy={{ required "proxyAddr is required (the Proxy's host:port)" .Values.proxyAddr }}
      env:
        - name: GATEWAY_JOIN_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ include "gateway-kube-agent.tokenSecret" . }}
              key: auth-token
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        # Where the agent exports its maintenance schedule for the updater (src/upgrade/kube/client.ts kubeScheduleWriter).
        - name: GATEWAY_KUBE_SCHEDULE_SECRET
          value: {{ include "gateway-kube-agent.sharedState" . }}
      ports:
        - name: diag
          containerPort: {{ .Values.diagPort }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: diag
        initialDelaySeconds: 5
        periodSeconds: 10
        failureThreshold: 6
      readinessProbe:
        httpGet:
          path: /readyz
          port: diag
        periodSeconds: 5
        failureThreshold: 12
      volumeMounts:
        - name: config
          mountPath: /etc/gateway
          readOnly: true
        - name: data
          mountPath: /var/lib/gateway
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "gateway-kube-agent.fullname" . }}
    {{- if ne .Values.agentKind "StatefulSet" }}
    - name: data
      emptyDir: {}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
