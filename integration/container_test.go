package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/testenv"
)

// The image's default configuration (examples/outboxd.yaml) names these.
const (
	exampleSlot  = "outboxd_comandes"
	exampleTopic = "comandes.esdeveniments"
)

// TestContainerImage builds the image from the repository's Dockerfile the
// offline way (BINARY=dist, BASE_IMAGE=scratch: a static binary built here),
// runs it with podman on the host network against the test's PostgreSQL and
// Kafka with the image's own command and configuration, and checks that the
// orders written arrive on the topic, that the image's HEALTHCHECK passes,
// that outboxd runs as uid 65532, and that `podman stop` is a clean stop
// (exit 0, the slot confirmed past every row).
func TestContainerImage(t *testing.T) {
	kafkaOnly(t)
	needEnv(t)
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("SKIPPED: podman is not installed, so the container image is NOT built or run here " +
			"(apt-get install podman runc, and default_ulimits = [] in /etc/containers/containers.conf; .ci/run does both)")
	}
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, seedSchema, nil)
	containerImageTest(t, podman, root, f.dsn, env.KafkaBrokers)
}

// containerImageTest needs only a database with sql/001_outbox.sql applied
// (dsn, as a superuser: the example configuration creates the slot and the
// publication) and a broker.
func containerImageTest(t *testing.T, podman, root, dsn, brokers string) {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	tag := fmt.Sprintf("localhost/outboxd-test:%d", os.Getpid())
	name := fmt.Sprintf("outboxd-test-%d", os.Getpid())
	// pod runs podman and returns its standard output; the standard error
	// goes into the error. (Without systemd, podman logs that it cannot
	// schedule health checks: harmless, `podman healthcheck run` runs one.)
	pod := func(args ...string) (string, error) {
		cmd := exec.Command(podman, args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("%w: %s", err, errb.String())
		}
		return out.String(), nil
	}
	mustPod := func(args ...string) string {
		t.Helper()
		out, err := pod(args...)
		if err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	// A fixed slot and topic (the example configuration's): clear what an
	// earlier run may have left, and leave nothing behind.
	dropSlot := func() {
		for i := 0; i < 50; i++ {
			var left int
			_, _ = db.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", exampleSlot)
			if err := db.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", exampleSlot).Scan(&left); err != nil || left == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	dropSlot()
	deleteTopic(brokers, exampleTopic)
	t.Cleanup(func() {
		dropSlot()
		deleteTopic(brokers, exampleTopic)
	})
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := testenv.CreateTopic(tctx, brokers, exampleTopic, 3); err != nil {
		t.Fatal(err)
	}

	// The build context: the repository's Dockerfile and .dockerignore, the
	// file the final stage copies, and dist/ as `make dist` lays it out.
	bctx := t.TempDir()
	for _, f := range []string{"Dockerfile", ".dockerignore", "examples/outboxd.yaml"} {
		copyFile(t, filepath.Join(root, f), filepath.Join(bctx, f))
	}
	copyFile(t, "/etc/ssl/certs/ca-certificates.crt", filepath.Join(bctx, "dist", "ca-certificates.crt"))
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/outboxd/outboxd.Version=container-test",
		"-o", filepath.Join(bctx, "dist", "outboxd"), "./cmd/outboxd")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}

	// The build leaves a cached image per stage (--layers=false cannot be
	// used: buildah 1.28 then fails removing the aliased stage, "identifier
	// is not an image"); the cleanup removes the images the build added.
	before := map[string]bool{}
	for _, id := range strings.Fields(mustPod("images", "-a", "-q", "--no-trunc")) {
		before[id] = true
	}
	t.Cleanup(func() {
		_, _ = pod("rmi", "-f", tag)
		after, _ := pod("images", "-a", "-q", "--no-trunc")
		for _, id := range strings.Fields(after) {
			if !before[id] {
				_, _ = pod("rmi", "-f", id)
			}
		}
	})
	start := time.Now()
	out := mustPod("build", "--format", "docker", "--build-arg", "BINARY=dist", "--build-arg", "BASE_IMAGE=scratch",
		"--build-arg", "VERSION=container-test", "-t", tag, bctx)
	if strings.Contains(out, "Trying to pull") {
		t.Errorf("the offline build tried to pull an image:\n%s", out)
	}
	buildTime := time.Since(start)
	var imgs []struct {
		Size        int64
		User        string
		Healthcheck struct{ Test []string }
	}
	decodeInspect(t, mustPod("image", "inspect", tag), &imgs)
	if len(imgs) != 1 {
		t.Fatalf("podman image inspect %s: %d images", tag, len(imgs))
	}
	img := imgs[0]
	t.Logf("image %s: %.1f MiB, built in %s", tag, float64(img.Size)/(1<<20), buildTime.Round(time.Millisecond))
	if img.User != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532", img.User)
	}
	if want := []string{"CMD", "/outboxd", "health", "-c", "/etc/outboxd/outboxd.yaml"}; strings.Join(img.Healthcheck.Test, " ") != strings.Join(want, " ") {
		t.Errorf("healthcheck %q, want %q (podman build without --format docker drops it)", img.Healthcheck.Test, want)
	}
	if v := mustPod("run", "--rm", "--network", "host", tag, "version"); !strings.HasPrefix(v, "outboxd container-test (go1.") {
		t.Errorf("outboxd version in the image: %q", v)
	}

	// Run it with the image's own command and configuration.
	health := freePort(t)
	start = time.Now()
	mustPod("run", "-d", "--name", name, "--network", "host",
		"-e", "KM0_DSN="+dsn, "-e", "KAFKA_BROKERS="+brokers, "-e", "OUTBOXD_HEALTH_LISTEN="+health, tag)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("container log:\n%s", containerLogs(podman, name))
		}
		_, _ = pod("rm", "-f", "-t", "0", name)
	})
	waitHTTP(t, "http://"+health+"/readyz", 60*time.Second, func() string { return containerLogs(podman, name) })
	t.Logf("ready %s after podman run", time.Since(start).Round(time.Millisecond))

	var pid int
	decodeInspect(t, mustPod("inspect", "--format", "{{json .State.Pid}}", name), &pid)
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err != nil {
		t.Errorf("read the container's process status: %v", err)
	} else if uid := procField(string(st), "Uid:"); uid != "65532\t65532\t65532\t65532" {
		t.Errorf("outboxd runs with Uid %q, want 65532 throughout", uid)
	}

	// Orders written by the compose demo's writer (state and event in one
	// transaction, as a service does).
	const orders = 40
	writer := exec.Command("bash", filepath.Join(root, "examples", "compose", "writer.sh"))
	writer.Env = append(os.Environ(), "DATABASE_URL="+dsn, "SLOT="+exampleSlot, fmt.Sprintf("COUNT=%d", orders), "INTERVAL=0")
	if out, err := writer.CombinedOutput(); err != nil {
		t.Fatalf("examples/compose/writer.sh: %v\n%s", err, out)
	}
	ids := map[string]string{} // id_esdeveniment -> agregat_id
	rows, err := db.Query(ctx, "SELECT id::text, agregat_id FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, order string
		if err := rows.Scan(&id, &order); err != nil {
			t.Fatal(err)
		}
		ids[id] = order
	}
	if rows.Err() != nil || len(ids) != orders {
		t.Fatalf("the writer committed %d outbox rows (%v), want %d", len(ids), rows.Err(), orders)
	}
	cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
	defer ccancel()
	msgs, err := testenv.Consume(cctx, brokers, exampleTopic, orders)
	if err != nil {
		t.Fatal(err)
	}
	// The last commit delivered, from the records' own stream positions
	// (outboxd.stream): pg_current_wal_lsn() read after the writer can
	// include WAL the stream never reports (another database's, a
	// checkpoint's) until a keepalive, and made this check flaky.
	var lastCommit pglogrepl.LSN
	for _, m := range msgs {
		if f := strings.Split(header(m, sink.HeaderStream), ";"); len(f) == 8 {
			if n, err := strconv.ParseUint(f[4], 10, 64); err == nil && pglogrepl.LSN(n) > lastCommit {
				lastCommit = pglogrepl.LSN(n)
			}
		}
	}
	if lastCommit == 0 {
		t.Fatalf("no record carries a stream position (%s)", sink.HeaderStream)
	}
	for _, m := range msgs {
		id := header(m, "id_esdeveniment")
		order, ok := ids[id]
		if !ok {
			t.Errorf("a record with an id_esdeveniment not written: %q", id)
			continue
		}
		delete(ids, id)
		var env struct {
			Origen string          `json:"origen"`
			Tipus  string          `json:"tipus"`
			Dades  json.RawMessage `json:"dades"`
		}
		if string(m.Key) != order || json.Unmarshal(m.Value, &env) != nil || env.Origen != "comandes" || env.Tipus != "comanda.creada" ||
			!strings.Contains(string(env.Dades), order) {
			t.Errorf("record %s: key %q value %s", id, m.Key, m.Value)
		}
	}
	if len(ids) != 0 {
		t.Errorf("%d orders never arrived", len(ids))
	}
	t.Logf("%d records read %s after podman run", len(msgs), time.Since(start).Round(time.Millisecond))

	// The image's HEALTHCHECK, run the way the engine runs it.
	if out, err := pod("healthcheck", "run", name); err != nil {
		t.Errorf("podman healthcheck run: %v\n%s", err, out)
	}
	var state struct {
		Health struct {
			Status string
			Log    []struct {
				ExitCode int
				Output   string
			}
		}
	}
	decodeInspect(t, mustPod("inspect", "--format", "{{json .State}}", name), &state)
	if state.Health.Status != "healthy" || len(state.Health.Log) == 0 {
		t.Errorf("health after a check: %+v", state.Health)
	} else if last := state.Health.Log[len(state.Health.Log)-1]; last.ExitCode != 0 || !strings.Contains(last.Output, "healthz 200 OK: streaming") {
		t.Errorf("last health check: exit %d, output %q", last.ExitCode, last.Output)
	}
	// And the readiness variant, inside the container.
	if out, err := pod("exec", name, "/outboxd", "health", "--ready", "-c", "/etc/outboxd/outboxd.yaml"); err != nil || !strings.Contains(out, "readyz 200 OK") {
		t.Errorf("outboxd health --ready in the container: %v: %s", err, out)
	}

	// podman stop sends SIGTERM: a clean stop drains and confirms.
	mustPod("stop", "-t", "40", name)
	var exit int
	decodeInspect(t, mustPod("inspect", "--format", "{{json .State.ExitCode}}", name), &exit)
	if exit != 0 {
		t.Errorf("exit code after podman stop: %d, want 0", exit)
	}
	var confirmed string
	if err := db.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", exampleSlot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if lsn(t, confirmed) <= lastCommit {
		t.Errorf("slot confirmed %s after the clean stop, not past %s, the last commit delivered before it", confirmed, lastCommit)
	}
}

// containerLogs is what outboxd in the container wrote (to stderr).
func containerLogs(podman, name string) string {
	out, _ := exec.Command(podman, "logs", name).CombinedOutput()
	return string(out)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func decodeInspect(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), v); err != nil {
		t.Fatalf("podman inspect output %q: %v", out, err)
	}
}

func procField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// waitHTTP polls url until it answers 200.
func waitHTTP(t *testing.T, url string, timeout time.Duration, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s not 200 after %s (last: %s)\n%s", url, timeout, last, logs())
}

// deleteTopic deletes a topic through the controller; a missing one is fine.
func deleteTopic(brokers, topic string) {
	conn, err := kafka.Dial("tcp", strings.Split(brokers, ",")[0])
	if err != nil {
		return
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return
	}
	cc, err := kafka.Dial("tcp", fmt.Sprintf("%s:%d", ctrl.Host, ctrl.Port))
	if err != nil {
		return
	}
	defer cc.Close()
	_ = cc.DeleteTopics(topic)
}
