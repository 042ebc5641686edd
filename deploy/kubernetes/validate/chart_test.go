package validate

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/outboxd/outboxd/config"
)

// chartDir is deploy/helm/outboxd. The chart is rendered by Helm's own
// loader and engine, as `helm template` does, and every object it renders
// goes through the same decode and checkDeployment as deploy/kubernetes.
const chartDir = "../../helm/outboxd"

// The templates' names in the rendering.
const (
	chartDeployment   = "outboxd/templates/deployment.yaml"
	serviceDeployment = "comandes/templates/deployment.yaml"
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load %s: %v", chartDir, err)
	}
	return ch
}

// loadServiceChart is testdata/comandes, the example service chart that
// includes outboxd's sidecar templates, with the outboxd chart as its
// dependency (what `helm dependency build` puts in charts/).
func loadServiceChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load("testdata/comandes")
	if err != nil {
		t.Fatalf("load testdata/comandes: %v", err)
	}
	ch.SetDependencies(loadChart(t))
	return ch
}

// capabilities are a Kubernetes 1.29 cluster's, the oldest the chart
// supports (native sidecars). Helm's defaults, in a test binary, are 1.20's
// (in the helm binary, its client-go's).
var capabilities = func() *common.Capabilities {
	caps := common.DefaultCapabilities.Copy()
	kv, err := common.ParseKubeVersion("v1.29.0")
	if err != nil {
		panic(err)
	}
	caps.KubeVersion = *kv
	return caps
}()

// render is `helm template --kube-version 1.29 --namespace km0 RELEASE CHART -f vals`.
func render(ch *chart.Chart, release string, vals map[string]any) (map[string]string, error) {
	rv, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: release, Namespace: "km0", IsInstall: true}, capabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	return engine.Render(ch, rv)
}

// renderManifests renders and decodes every object strictly.
func renderManifests(t *testing.T, ch *chart.Chart, release string, vals map[string]any) manifests {
	t.Helper()
	out, err := render(ch, release, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	m := newManifests()
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if strings.HasPrefix(path.Base(name), "_") || strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		m.decode(t, name, []byte(out[name]))
	}
	return m
}

// readValues reads a values file, and the overlay given as YAML on top.
func readValues(t *testing.T, file, overlay string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var base, over map[string]any
	if err := yaml.Unmarshal(data, &base); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if err := yaml.Unmarshal([]byte(overlay), &over); err != nil {
		t.Fatalf("overlay: %v", err)
	}
	return loader.MergeMaps(base, over)
}

// comandesValues are the values equivalent to deploy/kubernetes's files.
func comandesValues(t *testing.T, overlay string) map[string]any {
	return readValues(t, "testdata/comandes-values.yaml", overlay)
}

// addSecret stands for the Secret the chart references and never renders:
// secret.example.yaml's keys, and each other key the values name (a
// certificate for *.crt).
func addSecret(t *testing.T, m manifests, name string, vals map[string]any) {
	t.Helper()
	example := load(t).secrets["outboxd-comandes"]
	s := corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: maps.Clone(example.StringData)}
	keys, _ := vals["secret"].(map[string]any)
	for field, key := range keys {
		k, _ := key.(string)
		if field == "name" || k == "" {
			continue
		}
		if _, ok := s.StringData[k]; ok {
			continue
		}
		s.StringData[k] = "x"
		if strings.HasSuffix(k, ".crt") {
			s.StringData[k] = example.StringData["pg-ca.crt"]
		}
	}
	m.secrets[name] = s
}

// TestChartStandalone: the chart on its own, with the comandes values, is
// deploy/kubernetes's configmap.yaml, deployment.yaml and podmonitor.yaml,
// and passes the same checks.
func TestChartStandalone(t *testing.T) {
	vals := comandesValues(t, "")
	m := renderManifests(t, loadChart(t), "outboxd-comandes", vals)
	addSecret(t, m, "outboxd-comandes", vals)
	d, ok := m.deployments[chartDeployment]
	if !ok || len(m.deployments) != 1 {
		t.Fatalf("want one Deployment from %s, rendered %d", chartDeployment, len(m.deployments))
	}
	checkDeployment(t, m, d)
	if _, sidecar, _ := outboxdContainer(d.Spec.Template.Spec); sidecar || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || *d.Spec.Replicas != 1 {
		t.Errorf("standalone: sidecar %v, strategy %q, replicas %d: want a container, Recreate, 1", sidecar, d.Spec.Strategy.Type, *d.Spec.Replicas)
	}

	plain := load(t)
	sameDeployment(t, "deployment.yaml", plain.deployments["deployment.yaml"], d)
	sameConfigMap(t, plain.configMaps["outboxd-comandes"], m.configMaps["outboxd-comandes"])
	if len(plain.podMonitors) != 1 || len(m.podMonitors) != 1 {
		t.Fatalf("PodMonitors: %d in deploy/kubernetes, %d rendered; want 1 and 1", len(plain.podMonitors), len(m.podMonitors))
	}
	pm := m.podMonitors[0]
	pm.Labels = withoutHelmLabels(pm.Labels)
	same(t, "podmonitor.yaml", plain.podMonitors[0], pm)
	if len(m.networkPolicies) != 1 {
		t.Fatalf("%d NetworkPolicies rendered, want 1", len(m.networkPolicies))
	}
	np := m.networkPolicies[0]
	np.Labels = withoutHelmLabels(np.Labels)
	same(t, "networkpolicy.yaml", plain.networkPolicy(t, np.Name), np)
	checkHealthPolicy(t, "the chart's NetworkPolicy", np, d.Spec.Template.Labels)
}

// networkPolicy is the NetworkPolicy named name.
func (m manifests) networkPolicy(t *testing.T, name string) networkingv1.NetworkPolicy {
	t.Helper()
	for _, np := range m.networkPolicies {
		if np.Name == name {
			return np
		}
	}
	t.Fatalf("no NetworkPolicy %q", name)
	return networkingv1.NetworkPolicy{}
}

// checkHealthPolicy: np selects the pod (labels) and lets only the peers
// of one rule reach it, on the health port alone (issue 35, item 1: the
// port answers anyone, without authentication).
func checkHealthPolicy(t *testing.T, what string, np networkingv1.NetworkPolicy, labels map[string]string) {
	t.Helper()
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if labels[k] != v {
			t.Errorf("%s: selects %s=%s, the pod has %q", what, k, v, labels[k])
		}
	}
	if len(np.Spec.PodSelector.MatchLabels) == 0 || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("%s: selector %v, policy types %v: want the pod selected, Ingress", what, np.Spec.PodSelector.MatchLabels, np.Spec.PolicyTypes)
	}
	var health []networkingv1.NetworkPolicyIngressRule
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port != nil && p.Port.IntValue() == 9597 {
				health = append(health, r)
			}
		}
	}
	if len(health) != 1 || len(health[0].From) == 0 || len(health[0].Ports) != 1 {
		t.Errorf("%s: rules for the health port %v: want one, with peers, for that port alone", what, health)
	}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			t.Errorf("%s: a rule for every port %v lets its peers reach the health port too", what, r)
		}
	}
}

// TestChartSidecar: a service's chart (testdata/comandes) that includes
// outboxd.sidecar renders deploy/kubernetes/sidecar.yaml, outboxd a native
// sidecar, and the outboxd chart then renders no Deployment of its own.
func TestChartSidecar(t *testing.T) {
	vals := map[string]any{"outboxd": comandesValues(t, "")}
	m := renderManifests(t, loadServiceChart(t), "comandes", vals)
	addSecret(t, m, "outboxd-comandes", vals["outboxd"].(map[string]any))
	d, ok := m.deployments[serviceDeployment]
	if !ok || len(m.deployments) != 1 {
		t.Fatalf("want only the service's Deployment, rendered %v", slices.Sorted(maps.Keys(m.deployments)))
	}
	checkDeployment(t, m, d)
	if _, sidecar, _ := outboxdContainer(d.Spec.Template.Spec); !sidecar {
		t.Error("outboxd is not an init container (native sidecar)")
	}
	plain := load(t)
	sameDeployment(t, "sidecar.yaml", plain.deployments["sidecar.yaml"], d)
	if len(m.networkPolicies) != 1 {
		t.Fatalf("%d NetworkPolicies rendered, want the service's", len(m.networkPolicies))
	}
	same(t, "sidecar.yaml's NetworkPolicy", plain.networkPolicy(t, "comandes"), m.networkPolicies[0])
	checkHealthPolicy(t, "the service's NetworkPolicy", m.networkPolicies[0], d.Spec.Template.Labels)
	sameConfigMap(t, plain.configMaps["outboxd-comandes"], m.configMaps["outboxd-comandes"])
}

// TestChartValues: each value that changes what outboxd does, rendered,
// decoded, checked as above, and seen in the configuration outboxd parses
// (with the Secret's files mounted: a *_file outside the mount fails).
func TestChartValues(t *testing.T) {
	ch := loadChart(t)
	base := func(name string) string { return filepath.Base(name) }
	for _, tc := range []struct {
		name    string
		overlay string
		check   func(t *testing.T, cfg config.Config, d appsv1.Deployment)
	}{
		{"default", "", func(t *testing.T, cfg config.Config, _ appsv1.Deployment) {
			if cfg.Postgres.TLS.Mode != "verify-full" || base(cfg.Postgres.TLS.CAFile) != "pg-ca.crt" || base(cfg.Postgres.PasswordFile) != "pg-password" || base(cfg.Kafka.StreamKeyFile) != "stream-key" {
				t.Errorf("postgres tls %+v, password_file %q, stream_key_file %q", cfg.Postgres.TLS, cfg.Postgres.PasswordFile, cfg.Kafka.StreamKeyFile)
			}
			if cfg.Kafka.TLS.Enable || cfg.Kafka.SASL.Mechanism != "" || cfg.Kafka.Transactions || cfg.Retention.MaxAge != 0 || cfg.Tracing.Endpoint != "" {
				t.Errorf("the default turns on kafka tls %v, sasl %q, transactions %v, retention %s, tracing %q",
					cfg.Kafka.TLS.Enable, cfg.Kafka.SASL.Mechanism, cfg.Kafka.Transactions, cfg.Retention.MaxAge, cfg.Tracing.Endpoint)
			}
		}},
		{"postgres TLS without a CA", "secret: {postgresCA: \"\"}\nconfig: {postgres: {tls: {mode: require}}}", func(t *testing.T, cfg config.Config, _ appsv1.Deployment) {
			if cfg.Postgres.TLS.Mode != "require" || cfg.Postgres.TLS.CAFile != "" {
				t.Errorf("postgres tls %+v, want require without ca_file", cfg.Postgres.TLS)
			}
		}},
		{"kafka TLS", "secret: {kafkaCA: kafka-ca.crt}\nconfig: {kafka: {tls: {enable: true}}}", func(t *testing.T, cfg config.Config, _ appsv1.Deployment) {
			if !cfg.Kafka.TLS.Enable || base(cfg.Kafka.TLS.CAFile) != "kafka-ca.crt" {
				t.Errorf("kafka tls %+v, want enabled with the Secret's kafka-ca.crt", cfg.Kafka.TLS)
			}
		}},
		{"SASL", "secret: {kafkaCA: kafka-ca.crt, kafkaSASLPassword: kafka-password}\nconfig: {kafka: {tls: {enable: true}, sasl: {mechanism: SCRAM-SHA-512, username: outboxd}}}", func(t *testing.T, cfg config.Config, _ appsv1.Deployment) {
			if cfg.Kafka.SASL.Mechanism != "SCRAM-SHA-512" || base(cfg.Kafka.SASL.PasswordFile) != "kafka-password" {
				t.Errorf("kafka sasl mechanism %q, password_file %q, want SCRAM-SHA-512 with the Secret's kafka-password", cfg.Kafka.SASL.Mechanism, cfg.Kafka.SASL.PasswordFile)
			}
		}},
		{"transactions", "config: {kafka: {transactions: true}}", func(t *testing.T, cfg config.Config, _ appsv1.Deployment) {
			if !cfg.Kafka.Transactions {
				t.Error("kafka.transactions is not on")
			}
		}},
		{"housekeeping", "config: {retention: {max_age: 168h}}", func(t *testing.T, cfg config.Config, _ appsv1.Deployment) {
			if cfg.Retention.MaxAge != 168*time.Hour {
				t.Errorf("retention.max_age %s, want 168h", cfg.Retention.MaxAge)
			}
		}},
		{"tracing", "secret: {tracingCA: tracing-ca.crt}\nconfig: {tracing: {endpoint: \"https://otel-collector.observability.svc:4318\", sample_ratio: 0.1}}", func(t *testing.T, cfg config.Config, _ appsv1.Deployment) {
			if cfg.Tracing.Endpoint != "https://otel-collector.observability.svc:4318" || cfg.Tracing.SampleRatio != 0.1 || base(cfg.Tracing.CAFile) != "tracing-ca.crt" {
				t.Errorf("tracing %+v, want the endpoint, ratio 0.1 and the Secret's tracing-ca.crt", cfg.Tracing)
			}
		}},
		{"shutdown timeout", "shutdownTimeoutSeconds: 90", func(t *testing.T, cfg config.Config, d appsv1.Deployment) {
			if cfg.Pipeline.ShutdownTimeout != 90*time.Second || *d.Spec.Template.Spec.TerminationGracePeriodSeconds != 105 {
				t.Errorf("shutdown_timeout %s, grace %ds, want 90s and 105s", cfg.Pipeline.ShutdownTimeout, *d.Spec.Template.Spec.TerminationGracePeriodSeconds)
			}
		}},
		{"health port", "healthPort: 9600", func(t *testing.T, cfg config.Config, d appsv1.Deployment) {
			if cfg.Health.Listen != "0.0.0.0:9600" || d.Spec.Template.Annotations["prometheus.io/port"] != "9600" {
				t.Errorf("health.listen %q, prometheus.io/port %q, want port 9600", cfg.Health.Listen, d.Spec.Template.Annotations["prometheus.io/port"])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := comandesValues(t, tc.overlay)
			m := renderManifests(t, ch, "outboxd-comandes", vals)
			addSecret(t, m, "outboxd-comandes", vals)
			d, ok := m.deployments[chartDeployment]
			if !ok {
				t.Fatal("no Deployment rendered")
			}
			tc.check(t, checkDeployment(t, m, d), d)
		})
	}

	t.Run("no Deployment", func(t *testing.T) {
		m := renderManifests(t, ch, "outboxd-comandes", comandesValues(t, "deployment: {enabled: false}"))
		if len(m.deployments) != 0 || len(m.configMaps) != 1 {
			t.Errorf("deployment.enabled false rendered %d Deployments and %d ConfigMaps, want 0 and 1", len(m.deployments), len(m.configMaps))
		}
	})
}

// TestChartRefuses: a credential in the ConfigMap, or a setting the chart
// owns, fails the rendering with the value to use instead; so does a value
// values.schema.json does not know or types otherwise.
func TestChartRefuses(t *testing.T) {
	ch := loadChart(t)
	for overlay, want := range map[string]string{
		"config: {postgres: {password: hunter2}}":        "secret.postgresPassword",
		"config: {kafka: {sasl: {password: hunter2}}}":   "secret.kafkaSASLPassword",
		"config: {pipeline: {shutdown_timeout: 10s}}":    "shutdownTimeoutSeconds",
		"config: {health: {listen: \"127.0.0.1:9597\"}}": "healthPort",
		"config: {pipeline: {memory_limit: 100000000}}":  "resources.limits.memory",
		"shutdownTimeoutSecond: 10":                      "shutdownTimeoutSecond",
		"healthPort: \"9597\"":                           "healthPort",
	} {
		_, err := render(ch, "outboxd-comandes", comandesValues(t, overlay))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: rendering error %v, want one naming %s", overlay, err, want)
		}
	}
}

// TestChartLint is `helm lint --strict` (no warning) with the default values
// and with the comandes values.
func TestChartLint(t *testing.T) {
	for name, vals := range map[string]map[string]any{"default values": nil, "comandes values": comandesValues(t, "")} {
		res := lint.RunAll(chartDir, vals, "km0", lint.WithKubeVersion(&capabilities.KubeVersion))
		for _, msg := range res.Messages {
			if msg.Severity >= support.WarningSev {
				t.Errorf("%s: %v", name, msg)
			} else {
				t.Logf("%s: %v", name, msg)
			}
		}
	}
}

// TestChartRules: the PrometheusRule carries deploy/prometheus's rules,
// the ones promtool tests: the chart's copy is byte-equal to them
// (cp deploy/prometheus/outboxd-rules.yaml deploy/helm/outboxd/files/),
// and the rendered object holds exactly their groups.
func TestChartRules(t *testing.T) {
	want, err := os.ReadFile("../../prometheus/outboxd-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(chartDir + "/files/outboxd-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, got) {
		t.Error("deploy/helm/outboxd/files/outboxd-rules.yaml differs from deploy/prometheus/outboxd-rules.yaml: cp deploy/prometheus/outboxd-rules.yaml deploy/helm/outboxd/files/")
	}
	js, err := yaml.YAMLToJSONStrict(want)
	if err != nil {
		t.Fatal(err)
	}
	var spec monitoringv1.PrometheusRuleSpec
	if errs, err := kjson.UnmarshalStrict(js, &spec); err != nil || len(errs) > 0 {
		t.Fatalf("outboxd-rules.yaml as a PrometheusRule spec: %v %v", err, errs)
	}
	m := renderManifests(t, loadChart(t), "outboxd-comandes", comandesValues(t, ""))
	if len(m.prometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules rendered, want 1", len(m.prometheusRules))
	}
	if len(spec.Groups) == 0 || !equality.Semantic.DeepEqual(spec, m.prometheusRules[0].Spec) {
		t.Error("the rendered PrometheusRule's groups are not deploy/prometheus/outboxd-rules.yaml's")
	}
}

// helmLabels are the labels Helm's objects carry and the plain files do
// not: the only difference allowed, with the pod's checksum/config.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by"}

func withoutHelmLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if !slices.Contains(helmLabels, k) {
			out[k] = v
		}
	}
	return out
}

func sameDeployment(t *testing.T, file string, want, got appsv1.Deployment) {
	t.Helper()
	got.Labels = withoutHelmLabels(got.Labels)
	delete(got.Spec.Template.Annotations, "checksum/config")
	if len(got.Spec.Template.Annotations) == 0 {
		got.Spec.Template.Annotations = nil
	}
	same(t, file, want, got)
}

// sameConfigMap compares the configuration as YAML data (the plain file
// has comments, the chart's keys are sorted).
func sameConfigMap(t *testing.T, want, got corev1.ConfigMap) {
	t.Helper()
	var w, g any
	if err := yaml.Unmarshal([]byte(want.Data["outboxd.yaml"]), &w); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(got.Data["outboxd.yaml"]), &g); err != nil {
		t.Fatal(err)
	}
	same(t, "configmap.yaml's outboxd.yaml", w, g)
	want.Data, got.Data = nil, nil
	got.Labels = withoutHelmLabels(got.Labels)
	same(t, "configmap.yaml", want, got)
}

// same fails with the lines that differ when want and got, decoded, are not
// the same object.
func same(t *testing.T, what string, want, got any) {
	t.Helper()
	if equality.Semantic.DeepEqual(want, got) {
		return
	}
	w, _ := yaml.Marshal(want)
	g, _ := yaml.Marshal(got)
	wl, gl := strings.Split(string(w), "\n"), strings.Split(string(g), "\n")
	var diff []string
	for _, l := range wl {
		if !slices.Contains(gl, l) {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range gl {
		if !slices.Contains(wl, l) {
			diff = append(diff, "+ "+l)
		}
	}
	t.Errorf("%s and the chart's rendering differ (- deploy/kubernetes, + chart):\n%s", what, strings.Join(diff, "\n"))
}

// TestChartDocExample: docs/deployment.md's values-comandes.yaml installs.
func TestChartDocExample(t *testing.T) {
	page, err := os.ReadFile("../../../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	var example string
	for _, b := range strings.Split(string(page), "```yaml\n")[1:] {
		if strings.HasPrefix(b, "# values-comandes.yaml\n") {
			example = b[:strings.Index(b, "```")]
		}
	}
	if example == "" {
		t.Fatal("docs/deployment.md shows no values-comandes.yaml")
	}
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(example), &vals); err != nil {
		t.Fatalf("docs/deployment.md's values-comandes.yaml: %v", err)
	}
	m := renderManifests(t, loadChart(t), "outboxd-comandes", vals)
	addSecret(t, m, "outboxd-comandes", vals)
	d, ok := m.deployments[chartDeployment]
	if !ok {
		t.Fatal("no Deployment rendered")
	}
	checkDeployment(t, m, d)
}

// TestChartUpgrade: an upgrade replaces the pod when, and only when, what
// outboxd runs changes: a changed configuration changes the pod template
// (its checksum/config), on its own and as a sidecar; a value that leaves
// the configuration as it was (the service's replicas, the PodMonitor's
// interval) leaves the pod template as it was, so the pod keeps running.
// On its own the strategy stays Recreate: the old pod releases the slot
// before the new one starts.
func TestChartUpgrade(t *testing.T) {
	standalone := func(overlay string) corev1.PodTemplateSpec {
		m := renderManifests(t, loadChart(t), "outboxd-comandes", comandesValues(t, overlay))
		d := m.deployments[chartDeployment]
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("strategy %q, want Recreate", d.Spec.Strategy.Type)
		}
		return d.Spec.Template
	}
	sidecar := func(overlay, serviceOverlay string) corev1.PodTemplateSpec {
		var service map[string]any
		if err := yaml.Unmarshal([]byte(serviceOverlay), &service); err != nil {
			t.Fatal(err)
		}
		vals := loader.MergeMaps(map[string]any{"outboxd": comandesValues(t, overlay)}, service)
		return renderManifests(t, loadServiceChart(t), "comandes", vals).deployments[serviceDeployment].Spec.Template
	}
	moved := "config: {kafka: {brokers: [\"kafka-9.kafka.kafka.svc:9092\"]}}"
	for _, tc := range []struct {
		name        string
		before, now corev1.PodTemplateSpec
		replaced    bool
	}{
		{"standalone, same values", standalone(""), standalone(""), false},
		{"standalone, other PodMonitor interval", standalone(""), standalone("podMonitor: {interval: 30s}"), false},
		{"standalone, other brokers", standalone(""), standalone(moved), true},
		{"sidecar, other service replicas", sidecar("", ""), sidecar("", "replicas: 3"), false},
		{"sidecar, other brokers", sidecar("", ""), sidecar(moved, ""), true},
	} {
		if got := !equality.Semantic.DeepEqual(tc.before, tc.now); got != tc.replaced {
			t.Errorf("%s: pod template changed %v, want %v", tc.name, got, tc.replaced)
		}
		if tc.before.Annotations["checksum/config"] == "" {
			t.Errorf("%s: no checksum/config on the pod", tc.name)
		}
	}
}

// TestChartInstall is `helm install --dry-run=client` (Helm's install
// action, without a cluster): Kubernetes 1.29, the first with native
// sidecars, is admitted and 1.28 refused (by Chart.yaml's kubeVersion on
// its own; in a service's chart, whose kubeVersion alone Helm checks, by the
// ConfigMap's template); the release's
// manifest is the same objects as the engine's rendering above, on its own
// and in the service's chart (whose dependency the action processes).
func TestChartInstall(t *testing.T) {
	install := func(ch *chart.Chart, name string, vals map[string]any, kube string) (string, error) {
		t.Helper()
		kv, err := common.ParseKubeVersion(kube)
		if err != nil {
			t.Fatal(err)
		}
		inst := action.NewInstall(action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler)))
		inst.DryRunStrategy = action.DryRunClient
		inst.ReleaseName, inst.Namespace, inst.KubeVersion = name, "km0", kv
		r, err := inst.Run(ch, vals)
		if err != nil {
			return "", err
		}
		rel, ok := r.(*release.Release)
		if !ok {
			t.Fatalf("release %T", r)
		}
		return rel.Manifest, nil
	}
	for _, tc := range []struct {
		name, release string
		chart         func(*testing.T) *chart.Chart
		vals          map[string]any
	}{
		{"standalone", "outboxd-comandes", loadChart, comandesValues(t, "")},
		{"sidecar", "comandes", loadServiceChart, map[string]any{"outboxd": comandesValues(t, "")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			manifest, err := install(tc.chart(t), tc.release, tc.vals, "v1.29.0")
			if err != nil {
				t.Fatalf("install on Kubernetes 1.29: %v", err)
			}
			got := newManifests()
			got.decode(t, "the release's manifest", []byte(manifest))
			want := renderManifests(t, tc.chart(t), tc.release, tc.vals)
			if len(got.deployments) != 1 || len(want.deployments) != 1 {
				t.Fatalf("Deployments: %d installed, %d rendered; want 1", len(got.deployments), len(want.deployments))
			}
			for _, d := range want.deployments {
				same(t, "the installed Deployment", d, got.deployments["the release's manifest"])
			}
			same(t, "the installed ConfigMaps", want.configMaps, got.configMaps)
			same(t, "the installed PodMonitors", want.podMonitors, got.podMonitors)
			same(t, "the installed PrometheusRules", want.prometheusRules, got.prometheusRules)

			if _, err := install(tc.chart(t), tc.release, tc.vals, "v1.28.9"); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
				t.Errorf("install on Kubernetes 1.28: %v, want the chart's kubeVersion to refuse it (no native sidecars)", err)
			}
		})
	}
}
