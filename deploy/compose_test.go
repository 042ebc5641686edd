// Package deploy_test checks the deployment files against the code and
// against each other: docker-compose.yml, the systemd unit, the Prometheus
// rules and the Grafana dashboard. (The Kubernetes manifests are checked by
// their own module, deploy/kubernetes/validate, so that this one does not
// depend on the Kubernetes API types.)
package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/config"
)

// root is the repository, seen from this package's folder.
const root = ".."

// composeFile is the part of the compose specification the file uses; a
// key outside it (a typo such as `depends-on`) fails the strict decoding.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string                       `yaml:"image"`
	Build       string                       `yaml:"build"`
	Command     []string                     `yaml:"command"`
	Entrypoint  []string                     `yaml:"entrypoint"`
	Environment map[string]string            `yaml:"environment"`
	Volumes     []string                     `yaml:"volumes"`
	Ports       []string                     `yaml:"ports"`
	DependsOn   map[string]composeDependency `yaml:"depends_on"`
	Healthcheck *struct {
		Test        []string `yaml:"test"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		StartPeriod string   `yaml:"start_period"`
		Retries     int      `yaml:"retries"`
	} `yaml:"healthcheck"`
	StopGracePeriod string `yaml:"stop_grace_period"`
	Restart         string `yaml:"restart"`
}

type composeDependency struct {
	Condition string `yaml:"condition"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c composeFile
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// exampleConfig parses examples/outboxd.yaml (the image's default
// configuration) with env for its ${VAR}s, and returns the names it asked for.
// composeDefault is compose's ${VAR:-default}, whose default it keeps.
var composeDefault = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}`)

func exampleConfig(t *testing.T, env map[string]string) (config.Config, []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "examples", "outboxd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	cfg, err := config.Parse(data, func(name string) (string, bool) {
		asked = append(asked, name)
		v, ok := env[name]
		return v, ok
	}, nil)
	if err != nil {
		t.Fatalf("examples/outboxd.yaml with %v: %v", env, err)
	}
	return cfg, asked
}

// dockerfileInstruction returns the JSON argument list of the last
// instruction of that name in the Dockerfile (after "CMD" for HEALTHCHECK).
func dockerfileInstruction(t *testing.T, name string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	var args []string
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		if name == "HEALTHCHECK" {
			_, rest, _ = strings.Cut(rest, " CMD ")
		}
		args = nil
		if err := json.Unmarshal([]byte(strings.TrimSpace(rest)), &args); err != nil {
			t.Fatalf("Dockerfile %s %s: %v", name, rest, err)
		}
	}
	if args == nil {
		t.Fatalf("the Dockerfile has no %s", name)
	}
	return args
}

func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

func TestCompose(t *testing.T) {
	c := readCompose(t)

	// Every file the services mount is in the repository.
	for name, s := range c.Services {
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, "./") {
				if _, err := os.Stat(filepath.Join(root, src)); err != nil {
					t.Errorf("service %s mounts %s: %v", name, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("service %s mounts the volume %q, which is not declared", name, src)
			}
		}
		for dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on %q, which is not a service", name, dep)
			}
		}
	}

	// outboxd runs the image's own command, health check and configuration:
	// what TestContainerImage runs.
	o, ok := c.Services["outboxd"]
	if !ok {
		t.Fatal("no outboxd service")
	}
	if o.Build != "." {
		t.Errorf("outboxd builds %q, want the repository's Dockerfile (.)", o.Build)
	}
	if cmd := dockerfileInstruction(t, "CMD"); !slices.Equal(o.Command, cmd) {
		t.Errorf("outboxd command %q, the image's CMD is %q", o.Command, cmd)
	}
	if hc := dockerfileInstruction(t, "HEALTHCHECK"); o.Healthcheck == nil || !slices.Equal(o.Healthcheck.Test, append([]string{"CMD"}, hc...)) {
		t.Errorf("outboxd healthcheck %+v, want [CMD %s] (outboxd health: no curl in the image)", o.Healthcheck, strings.Join(hc, " "))
	}
	cfgPath := argAfter(o.Command, "-c")
	if !slices.Contains(o.Volumes, "./examples/outboxd.yaml:"+cfgPath+":ro") {
		t.Errorf("outboxd does not mount examples/outboxd.yaml at %s: %q", cfgPath, o.Volumes)
	}
	// What compose hands the container: its own ${VAR:-default} resolved
	// (to the defaults: no .env here).
	env := map[string]string{}
	for k, v := range o.Environment {
		env[k] = composeDefault.ReplaceAllString(v, "$1")
	}
	cfg, asked := exampleConfig(t, env)
	for _, name := range asked {
		if _, ok := o.Environment[name]; !ok {
			t.Errorf("examples/outboxd.yaml needs ${%s}, which the outboxd service does not set", name)
		}
	}
	_, port, _ := strings.Cut(cfg.Health.Listen, ":")
	if !slices.Contains(o.Ports, "127.0.0.1:"+port+":"+port) {
		t.Errorf("health.listen %s is not published on the host's loopback only (127.0.0.1:%s:%s): ports %q", cfg.Health.Listen, port, port, o.Ports)
	}
	// Every service publishes on the host's loopback only (issue 35, item
	// 5): PostgreSQL's superuser password is in the file, Kafka listens
	// in PLAINTEXT.
	for name, svc := range c.Services {
		for _, p := range svc.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q on every interface: bind it to 127.0.0.1", name, p)
			}
		}
	}
	if grace, err := time.ParseDuration(o.StopGracePeriod); err != nil || grace <= cfg.Pipeline.ShutdownTimeout {
		t.Errorf("stop_grace_period %q must exceed pipeline.shutdown_timeout %s, or the engine kills outboxd while it drains",
			o.StopGracePeriod, cfg.Pipeline.ShutdownTimeout)
	}
	if o.DependsOn["postgres"].Condition != "service_healthy" || o.DependsOn["kafka-init"].Condition != "service_completed_successfully" {
		t.Errorf("outboxd must wait for a healthy postgres and the topic: %+v", o.DependsOn)
	}

	// The topic that is created, read and routed to is one.
	topic := cfg.Routes[0].Topic
	for _, name := range []string{"kafka-init", "consumer"} {
		if got := argAfter(c.Services[name].Command, "--topic"); got != topic {
			t.Errorf("%s uses the topic %q, outboxd routes to %q", name, got, topic)
		}
	}
	// The writer runs the script the container test runs, on the slot
	// outboxd reads.
	w := c.Services["writer"]
	if !slices.Contains(w.Volumes, "./examples/compose/writer.sh:/writer.sh:ro") || !slices.Equal(w.Entrypoint, []string{"bash", "/writer.sh"}) {
		t.Errorf("the writer does not run examples/compose/writer.sh: %q %q", w.Volumes, w.Entrypoint)
	}
	if w.Environment["SLOT"] != cfg.Postgres.Slot {
		t.Errorf("the writer waits for the slot %q, outboxd uses %q", w.Environment["SLOT"], cfg.Postgres.Slot)
	}
	// The database name is the one the DSNs name.
	db := c.Services["postgres"].Environment["POSTGRES_DB"]
	for _, dsn := range []string{o.Environment["KM0_DSN"], w.Environment["DATABASE_URL"]} {
		if !regexp.MustCompile(`@postgres:5432/` + regexp.QuoteMeta(db) + `(\?|$)`).MatchString(dsn) {
			t.Errorf("DSN %q does not name postgres:5432/%s", dsn, db)
		}
	}
}
