// Package validate holds the test that checks deploy/kubernetes/*.yaml:
// strict decoding into the Kubernetes API types (and the Prometheus
// Operator's), then what the types cannot say (probes, grace period,
// securityContext, the embedded outboxd configuration). It is a module of
// its own so that outboxd's module does not depend on the Kubernetes API.
package validate
