{{- define "stator.name" -}}{{ .Release.Name }}-stator-operator{{- end -}}
{{- define "stator.labels" -}}
app.kubernetes.io/name: stator-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "stator.rules" -}}
- apiGroups: [stator.dev]
  resources: [statefulpipelines]
  verbs: [get, list, watch, patch, update]
- apiGroups: [stator.dev]
  resources: [statefulpipelines/status]
  verbs: [get, patch, update]
# spec.autoscaler rescales as kubectl scale does: through the scale subresource, which
# changes spec.replicas and nothing else.
- apiGroups: [stator.dev]
  resources: [statefulpipelines/scale]
  verbs: [get, patch]
# Driver pods, and what a driver's own Role grants (RBAC forbids granting more than one holds):
# executor pods, their ConfigMap and StatefulSet. Executors' state claims are listed and
# deleted (surplus after a rescale, all on delete, one on a lost node with pinning: preferred).
- apiGroups: [""]
  resources: [pods, services, configmaps]
  verbs: [get, list, watch, create, update, patch, delete, deletecollection]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, delete]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, delete, patch, update]
- apiGroups: [apps]
  resources: [statefulsets/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create]
# Checkpoint credentials, read to inspect checkpoints and dispose savepoints; each
# pipeline's control API tokens (NAME-control, and NAME-read: GETs only), created once; the
# first is read to call its driver.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, update]
# Each pipeline's driver Lease: created, and cleared once its holder's pod is gone, by the
# operator; taken and renewed by the driver (its Role names it).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update, patch]
# Each pipeline's NetworkPolicy (who may reach its driver).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
{{- define "stator.driverPolicyNamespaces" -}}
{{- if .Values.watchNamespaces }}
matchResources:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: {{ toJson .Values.watchNamespaces }}
{{- end }}
{{- end -}}
{{- /* A request by a pipeline driver's service account (NAME-stator), and its pipeline. */ -}}
{{- define "stator.driverRequest" -}}
matchConditions:
  - name: pipeline-driver
    expression: >-
      request.userInfo.username.startsWith('system:serviceaccount:') &&
      request.userInfo.username.endsWith('-stator')
variables:
  - name: account
    expression: request.userInfo.username.split(':')[3]
  - name: pipeline
    expression: variables.account.substring(0, size(variables.account) - 7)
{{- end -}}
