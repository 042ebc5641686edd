package validate

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/outboxd/outboxd/config"
)

// manifests is what deploy/kubernetes holds, or what the chart renders,
// decoded.
type manifests struct {
	configMaps      map[string]corev1.ConfigMap
	secrets         map[string]corev1.Secret
	deployments     map[string]appsv1.Deployment // by file or template name
	podMonitors     []monitoringv1.PodMonitor
	prometheusRules []monitoringv1.PrometheusRule
	networkPolicies []networkingv1.NetworkPolicy
}

func newManifests() manifests {
	return manifests{configMaps: map[string]corev1.ConfigMap{}, secrets: map[string]corev1.Secret{}, deployments: map[string]appsv1.Deployment{}}
}

// load decodes every document of every deploy/kubernetes/*.yaml strictly
// (decode).
func load(t *testing.T) manifests {
	t.Helper()
	files, err := filepath.Glob("../*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes (%v)", err)
	}
	m := newManifests()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m.decode(t, filepath.Base(f), data)
	}
	return m
}

// docSeparator splits a YAML stream into its documents.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// decode adds every document of data (a file, or a template the chart
// rendered, named file) strictly: an unknown or misplaced field, a wrong
// type or a bad quantity fails. A document of comments only is skipped.
func (m *manifests) decode(t *testing.T, file string, data []byte) {
	t.Helper()
	for i, doc := range docSeparator.Split(string(data), -1) {
		doc := []byte(doc)
		where := fmt.Sprintf("%s document %d", file, i+1)
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if tm.APIVersion == "" && tm.Kind == "" {
			var rest any
			if yaml.Unmarshal(doc, &rest) == nil && rest == nil {
				continue // comments or nothing (a disabled template)
			}
		}
		// As the API server decodes: case-sensitive field names (Go's
		// encoding/json, under sigs.k8s.io/yaml's UnmarshalStrict, would
		// accept readOnlyRootFileSystem), no unknown or duplicate field.
		strict := func(v any) {
			js, err := yaml.YAMLToJSONStrict(doc)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				return
			}
			strictErrs, err := kjson.UnmarshalStrict(js, v)
			for _, e := range append(strictErrs, err) {
				if e != nil {
					t.Errorf("%s (%s %s): %v", where, tm.APIVersion, tm.Kind, e)
				}
			}
		}
		var meta metav1.ObjectMeta
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 ConfigMap":
			var o corev1.ConfigMap
			strict(&o)
			m.configMaps[o.Name], meta = o, o.ObjectMeta
		case "v1 Secret":
			var o corev1.Secret
			strict(&o)
			m.secrets[o.Name], meta = o, o.ObjectMeta
		case "apps/v1 Deployment":
			var o appsv1.Deployment
			strict(&o)
			m.deployments[file], meta = o, o.ObjectMeta
		case "monitoring.coreos.com/v1 PodMonitor":
			var o monitoringv1.PodMonitor
			strict(&o)
			m.podMonitors, meta = append(m.podMonitors, o), o.ObjectMeta
		case "networking.k8s.io/v1 NetworkPolicy":
			var o networkingv1.NetworkPolicy
			strict(&o)
			m.networkPolicies, meta = append(m.networkPolicies, o), o.ObjectMeta
		case "monitoring.coreos.com/v1 PrometheusRule":
			var o monitoringv1.PrometheusRule
			strict(&o)
			m.prometheusRules, meta = append(m.prometheusRules, o), o.ObjectMeta
		default:
			t.Errorf("%s: unexpected %s %s (add it to this test)", where, tm.APIVersion, tm.Kind)
			continue
		}
		for _, msg := range validation.IsDNS1123Subdomain(meta.Name) {
			t.Errorf("%s: name %q: %s", where, meta.Name, msg)
		}
		checkLabels(t, where, meta.Labels)
	}
}

func checkLabels(t *testing.T, where string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			t.Errorf("%s: label %s=%s: %s", where, k, v, msg)
		}
	}
}

// outboxdContainer is the container named outboxd, and whether it is a
// (native) sidecar in the init containers.
func outboxdContainer(spec corev1.PodSpec) (corev1.Container, bool, bool) {
	for _, c := range spec.InitContainers {
		if c.Name == "outboxd" {
			return c, true, true
		}
	}
	for _, c := range spec.Containers {
		if c.Name == "outboxd" {
			return c, false, true
		}
	}
	return corev1.Container{}, false, false
}

// measuredPeakRSS is docs/reports/PERFORMANCE.md's peak RSS (500,000-row drain).
var measuredPeakRSS = resource.MustParse("32Mi")

func TestManifests(t *testing.T) {
	m := load(t)
	if len(m.deployments) < 2 {
		t.Fatalf("want the standalone and the sidecar Deployment, found %d", len(m.deployments))
	}
	for file, d := range m.deployments {
		t.Run(file, func(t *testing.T) { checkDeployment(t, m, d) })
	}
}

// checkDeployment checks what the types cannot say about a Deployment
// running outboxd, and returns the configuration outboxd would run with.
func checkDeployment(t *testing.T, m manifests, d appsv1.Deployment) config.Config {
	t.Helper()
	pod := d.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("the selector %v does not match the pod labels %v (%v)", d.Spec.Selector, pod.Labels, err)
	}
	checkLabels(t, "pod template", pod.Labels)
	c, sidecar, ok := outboxdContainer(pod.Spec)
	if !ok {
		t.Fatal("no container named outboxd")
	}
	if sidecar && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
		t.Error("an outboxd init container must be a native sidecar (restartPolicy: Always), or it blocks the pod's start for ever")
	}

	// The configuration it runs: the ConfigMap's file, mounted where -c
	// says, valid for outboxd with the variables the container sets.
	if len(c.Args) != 3 || c.Args[0] != "run" || c.Args[1] != "-c" {
		t.Fatalf("args %q, want [run -c FILE]", c.Args)
	}
	cfgPath := c.Args[2]
	var cm corev1.ConfigMap
	var key string
	for _, vm := range c.VolumeMounts {
		if filepath.Dir(cfgPath) != vm.MountPath {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				cm = m.configMaps[v.ConfigMap.Name]
				key = filepath.Base(cfgPath)
				for _, it := range v.ConfigMap.Items {
					if it.Path == filepath.Base(cfgPath) {
						key = it.Key
					}
				}
			}
		}
	}
	raw, ok := cm.Data[key]
	if !ok {
		t.Fatalf("-c %s is not a key of a ConfigMap in deploy/kubernetes mounted there", cfgPath)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			t.Errorf("env %s comes from the Secret %s: mount it as a file (postgres.password_file) instead; every process of the container can read its environment", e.Name, ref.SecretKeyRef.Name)
		}
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken is not false: outboxd never talks to the API server, and a token in the pod is one more secret to steal")
	}
	// The Secrets mounted as files, written where the test can read them:
	// the configuration names them (password_file, tls.ca_file), and
	// parsing it reads them.
	raw = mountSecrets(t, m, pod.Spec, c, raw)
	cfg, err := config.Parse([]byte(raw), func(name string) (string, bool) {
		if _, ok := env[name]; !ok {
			return "", false
		}
		return "x", true
	}, os.ReadFile)
	if err != nil {
		t.Fatalf("ConfigMap %s key %s is not a valid outboxd configuration with the container's environment: %v", cm.Name, key, err)
	}

	// The health server: on all interfaces (the kubelet probes the pod IP)
	// at the container port the probes and the PodMonitor name.
	host, port, err := net.SplitHostPort(cfg.Health.Listen)
	if err != nil || (host != "" && host != "0.0.0.0" && host != "::") {
		t.Errorf("health.listen %q: the kubelet and Prometheus reach the pod IP, not loopback", cfg.Health.Listen)
	}
	var healthPort *corev1.ContainerPort
	for i, p := range c.Ports {
		if strconv.Itoa(int(p.ContainerPort)) == port {
			healthPort = &c.Ports[i]
		}
		for _, msg := range validation.IsValidPortName(p.Name) {
			t.Errorf("port name %q: %s", p.Name, msg)
		}
	}
	if healthPort == nil {
		t.Fatalf("no container port %s (health.listen %s)", port, cfg.Health.Listen)
	}
	if a := pod.Annotations["prometheus.io/port"]; a != "" && a != port {
		t.Errorf("prometheus.io/port %s, health.listen port %s", a, port)
	}
	probe := func(name string, p *corev1.Probe) string {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", name)
			return ""
		}
		if p.HTTPGet.Port.String() != healthPort.Name && p.HTTPGet.Port.String() != port {
			t.Errorf("%s probe on port %s, the health port is %s (%s)", name, p.HTTPGet.Port.String(), healthPort.Name, port)
		}
		return p.HTTPGet.Path
	}
	if path := probe("liveness", c.LivenessProbe); path != "/healthz" {
		t.Errorf("liveness probe on %q, want /healthz", path)
	}
	// /readyz is 503 on a standby by design: only a single instance, never
	// replaced by a rolling update, may probe readiness on it; a sidecar's
	// readiness is the service's, which must not depend on Kafka.
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	single := replicas == 1 && d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType && !sidecar
	switch path := probe("readiness", c.ReadinessProbe); {
	case single && path != "/readyz":
		t.Errorf("a single outboxd probes readiness on %q, want /readyz", path)
	case !single && path != "/healthz":
		t.Errorf("readiness on %q with %d replicas (sidecar %v, strategy %q): a standby would never be ready and rollouts would stall; want /healthz",
			path, replicas, sidecar, d.Spec.Strategy.Type)
	}

	// A clean stop needs its shutdown_timeout before the SIGKILL.
	grace := time.Duration(0)
	if p := pod.Spec.TerminationGracePeriodSeconds; p != nil {
		grace = time.Duration(*p) * time.Second
	}
	if grace <= cfg.Pipeline.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %s must exceed pipeline.shutdown_timeout %s", grace, cfg.Pipeline.ShutdownTimeout)
	}

	// Non-root, read-only, no privileges.
	psc, sc := pod.Spec.SecurityContext, c.SecurityContext
	if sc == nil {
		t.Fatal("no container securityContext")
	}
	nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
	uid := sc.RunAsUser
	if uid == nil && psc != nil {
		uid = psc.RunAsUser
	}
	if !nonRoot || uid == nil || *uid != 65532 {
		t.Errorf("runAsNonRoot %v, runAsUser %v: want non-root 65532 (the image's user)", nonRoot, uid)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	checkSpillDir(t, pod.Spec, c, cfg)
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("capabilities do not drop ALL")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("no RuntimeDefault seccomp profile")
	}

	// Resources sized from the measured RSS.
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	if req.Cmp(measuredPeakRSS) < 0 || lim.Cmp(*req) < 0 || lim.Value() < 2*measuredPeakRSS.Value() {
		t.Errorf("memory request %s, limit %s: want a request of at least the measured peak RSS %s and a limit of at least twice it",
			req, lim, &measuredPeakRSS)
	}
	if c.Resources.Requests.Cpu().IsZero() {
		t.Error("no CPU request")
	}
	checkMemoryLimit(t, env["GOMEMLIMIT"], cfg, lim)

	// Scraped by a PodMonitor on the health port.
	scraped := false
	for _, pm := range m.podMonitors {
		s, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || !s.Matches(labels.Set(pod.Labels)) {
			continue
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port != nil && *ep.Port == healthPort.Name && ep.Path == "/metrics" {
				scraped = true
			}
		}
	}
	if !scraped {
		t.Errorf("no PodMonitor selects these pods (%v) on port %s /metrics", pod.Labels, healthPort.Name)
	}
	return cfg
}

// checkMemoryLimit: the Go runtime's soft limit follows the container's
// memory limit: GOMEMLIMIT taken from it (and then no
// pipeline.memory_limit, which GOMEMLIMIT overrides), or a
// pipeline.memory_limit below it.
func checkMemoryLimit(t *testing.T, gomemlimit corev1.EnvVar, cfg config.Config, lim *resource.Quantity) {
	t.Helper()
	if gomemlimit.Name == "" {
		soft, ok := cfg.SoftMemoryLimit()
		if !ok || soft >= lim.Value() {
			t.Errorf("no GOMEMLIMIT, and the soft memory limit (pipeline.memory_limit) %d is not below the container's limit %s", soft, lim)
		}
		return
	}
	ref := gomemlimit.ValueFrom
	if ref == nil || ref.ResourceFieldRef == nil || ref.ResourceFieldRef.Resource != "limits.memory" ||
		(ref.ResourceFieldRef.ContainerName != "" && ref.ResourceFieldRef.ContainerName != "outboxd") {
		t.Errorf("GOMEMLIMIT %+v: want it from outboxd's limits.memory", gomemlimit)
	}
	if cfg.Pipeline.MemoryLimit != 0 {
		t.Errorf("pipeline.memory_limit %d is ignored: GOMEMLIMIT, from the container's limit, wins", cfg.Pipeline.MemoryLimit)
	}
}

// mountSecrets writes the Secret volumes the container mounts into a
// temporary directory, file by key as the kubelet does, and returns cfg with
// their mount paths pointing there.
func mountSecrets(t *testing.T, m manifests, spec corev1.PodSpec, c corev1.Container, cfg string) string {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			s, ok := m.secrets[v.Secret.SecretName]
			if !ok {
				t.Fatalf("volume %s: no Secret %s (secret.example.yaml)", v.Name, v.Secret.SecretName)
			}
			dir := t.TempDir()
			for key, val := range s.StringData {
				if err := os.WriteFile(filepath.Join(dir, key), []byte(val), 0o400); err != nil {
					t.Fatal(err)
				}
			}
			cfg = strings.ReplaceAll(cfg, vm.MountPath+"/", dir+"/")
		}
	}
	return cfg
}

// checkSpillDir: with streaming on, the directory where a streamed
// transaction's outbox changes wait for its commit (pipeline.spill_dir,
// else the image's /tmp) is a writable emptyDir of the pod, or outboxd
// finds it read-only (readOnlyRootFilesystem) and turns streaming off.
func checkSpillDir(t *testing.T, spec corev1.PodSpec, c corev1.Container, cfg config.Config) {
	t.Helper()
	if !cfg.Postgres.Streaming {
		return
	}
	dir := cfg.Pipeline.SpillDir
	if dir == "" {
		dir = "/tmp" // os.TempDir() in the image: no TMPDIR
	}
	for _, e := range c.Env {
		if e.Name == "TMPDIR" && cfg.Pipeline.SpillDir == "" {
			dir = e.Value
		}
	}
	for _, vm := range c.VolumeMounts {
		if vm.ReadOnly || (dir != vm.MountPath && !strings.HasPrefix(dir, vm.MountPath+"/")) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != vm.Name {
				continue
			}
			if v.EmptyDir == nil {
				t.Errorf("the spill directory %s is on volume %s, not an emptyDir: a streamed transaction's spill files belong to one process", dir, v.Name)
			} else if v.EmptyDir.SizeLimit == nil {
				t.Errorf("the spill directory's emptyDir %s has no sizeLimit", v.Name)
			}
			return
		}
	}
	t.Errorf("postgres.streaming is on and the spill directory %s is no writable mount (the root file system is read-only): outboxd would turn streaming off", dir)
}
