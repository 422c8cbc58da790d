{{- define "vigil.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vigil.fullname" -}}
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

{{- define "vigil.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "vigil.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vigil
{{- end -}}

{{/* selector labels of one role: (dict "root" $ "component" "api") */}}
{{- define "vigil.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vigil.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vigil.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vigil.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "vigil.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "vigil.databaseSecret" -}}
{{- required "database.existingSecret is required: name a Secret holding the database URL" .Values.database.existingSecret -}}
{{- end -}}

{{/* env of every Vigil container: the database URL and secret-backed extras */}}
{{- define "vigil.commonEnv" -}}
- name: VIGIL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "vigil.databaseSecret" . }}
      key: {{ .Values.database.key }}
- name: HOME
  value: /tmp
{{- range .Values.extraSecretEnv }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
One Vigil Deployment. Arguments: (dict "root" $ "component" "consumer" "role" .Values.consumer
  "args" (list "consume") "replicas" 3 "http" false "llm" false "apiKeys" false)
*/}}
{{- define "vigil.deployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "vigil.fullname" $root }}-{{ .component }}
  labels:
    {{- include "vigil.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- if not .autoscaled }}
  replicas: {{ .replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  {{- with .strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "vigil.selectorLabels" (dict "root" $root "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "vigil.selectorLabels" (dict "root" $root "component" .component) | nindent 8 }}
        app.kubernetes.io/part-of: vigil
        {{- if not .http }}
        vigil.dev/metrics: worker
        {{- end }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        checksum/files: {{ include (print $root.Template.BasePath "/configmap-files.yaml") $root | sha256sum }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "vigil.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: 30
      containers:
        - name: {{ .component }}
          image: {{ include "vigil.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args:
            {{- toYaml .args | nindent 12 }}
          securityContext:
            {{- toYaml $v.securityContext | nindent 12 }}
          envFrom:
            - configMapRef:
                name: {{ include "vigil.fullname" $root }}-env
            {{- if and .llm $v.llm.existingSecret }}
            - secretRef:
                name: {{ $v.llm.existingSecret }}
            {{- end }}
          env:
            {{- include "vigil.commonEnv" $root | nindent 12 }}
            - name: OTEL_SERVICE_NAME
              value: vigil-{{ .component }}
            {{- if and .apiKeys $v.apiKeys.existingSecret }}
            - name: VIGIL_API_KEYS
              valueFrom:
                secretKeyRef:
                  name: {{ $v.apiKeys.existingSecret }}
                  key: {{ $v.apiKeys.key }}
            {{- end }}
            {{- if and .apiKeys $v.review.sessionSecret.existingSecret }}
            - name: VIGIL_REVIEW_SESSION_SECRET
              valueFrom:
                secretKeyRef:
                  name: {{ $v.review.sessionSecret.existingSecret }}
                  key: {{ $v.review.sessionSecret.key }}
            {{- end }}
          ports:
            {{- if .http }}
            - name: http
              containerPort: 8000
              protocol: TCP
            {{- if $v.api.otlpGrpcPort }}
            - name: otlp-grpc
              containerPort: {{ $v.api.otlpGrpcPort }}
              protocol: TCP
            {{- end }}
            {{- else }}
            - name: metrics
              containerPort: {{ $v.metrics.port }}
              protocol: TCP
            {{- end }}
          {{- if .http }}
          {{- /* the API's /healthz needs no database; with api.args running `vigil serve` without --no-workers
               it also answers 503 once an in-process loop (judge worker, detector) stalls or ends */}}
          startupProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 2
            failureThreshold: 60
          livenessProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          readinessProbe:
            httpGet: {path: /readyz, port: http}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 3
          {{- else }}
          {{- /* workers answer on their metrics port, from their loop's heartbeat: 503 once it stalls past
               config.VIGIL_LIVENESS_STALL_SECONDS (default 300 s) or has ended */}}
          livenessProbe:
            httpGet: {path: /healthz, port: metrics}
            initialDelaySeconds: 20
            periodSeconds: 15
            timeoutSeconds: 5
            failureThreshold: 4
          {{- end }}
          resources:
            {{- toYaml .role.resources | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            - name: rules
              mountPath: /app/rules
              readOnly: true
            {{- if $v.rules.extra }}
            - name: rules-extra
              mountPath: /app/rules-extra
              readOnly: true
            {{- end }}
            {{- if $v.judges.enabled }}
            - name: judges
              mountPath: /app/judges
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 256Mi
        - name: rules
          configMap:
            name: {{ include "vigil.fullname" $root }}-rules
        {{- if $v.rules.extra }}
        - name: rules-extra
          configMap:
            name: {{ include "vigil.fullname" $root }}-rules-extra
        {{- end }}
        {{- if $v.judges.enabled }}
        - name: judges
          configMap:
            name: {{ include "vigil.fullname" $root }}-judges
            {{- with $root.Files.Glob "files/judges/*/*" }}
            items:
              {{- range $path, $_ := . }}
              - key: {{ include "vigil.judgeKey" $path }}
                path: {{ base (dir $path) }}/{{ base $path }}
              {{- end }}
            {{- end }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* ConfigMap key of a judge file: files/judges/<name>/<file> -> <name>__<file> */}}
{{- define "vigil.judgeKey" -}}
{{- printf "%s__%s" (base (dir .)) (base .) -}}
{{- end -}}
