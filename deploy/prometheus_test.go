package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const rulesDir = "prometheus"

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name          string `yaml:"name"`
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestAlertRulesCoverage: every alert uses metrics outboxd exposes, has a
// severity and a runbook, and is tested both firing and quiet.
func TestAlertRulesCoverage(t *testing.T) {
	var rules ruleFile
	readYAML(t, filepath.Join(rulesDir, "outboxd-rules.yaml"), &rules)
	var tests ruleTests
	readYAML(t, filepath.Join(rulesDir, "outboxd-rules.test.yaml"), &tests)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else if strings.Contains(tc.Name, "quiet") {
				quiet[a.Alertname] = true
			}
		}
	}
	known := knownMetrics(t)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if bad := unknownMetrics(known, r.Expr); len(bad) > 0 {
				t.Errorf("%s uses %v, which outboxd does not expose", r.Alert, bad)
			}
			if r.Labels["severity"] != "warning" && r.Labels["severity"] != "critical" {
				t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
			}
			for _, k := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[k]) == "" {
					t.Errorf("%s has no %s annotation", r.Alert, k)
				}
			}
			if !fires[r.Alert] {
				t.Errorf("%s: no promtool test in which it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no promtool test in which it stays quiet on a healthy instance", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts")
	}
}

// TestAlertRulesPromtool runs promtool check rules and promtool test rules.
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("SKIPPED: promtool is not installed, so the alert rules are NOT checked or unit-tested (apt-get install prometheus; .ci/run does)")
	}
	for _, args := range [][]string{
		{"check", "rules", "outboxd-rules.yaml"},
		{"test", "rules", "outboxd-rules.test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = rulesDir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}
