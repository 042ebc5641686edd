// Package validate holds the tests that check deploy/kubernetes/*.yaml and
// the Helm chart deploy/helm/outboxd (rendered by Helm's own engine):
// strict decoding into the Kubernetes API types (and the Prometheus
// Operator's), then what the types cannot say (probes, grace period,
// securityContext, the embedded outboxd configuration), the same checks
// for both, and that the files are the chart's rendering. It is a module of
// its own so that outboxd's module depends on neither Kubernetes nor Helm.
package validate
