package outboxd_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/postgres"
)

// The documentation's tests: every link of the README, CONTRIBUTING.md and
// docs/ resolves, the files and functions the pages name exist, and every
// configuration they show decodes with the real loader. They read files
// only: no PostgreSQL, no Kafka.

// docPages are the repository's Markdown pages, by path from the root.
func docPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md", "CONTRIBUTING.md"}
	err := filepath.WalkDir("docs", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, filepath.ToSlash(path))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 10 {
		t.Fatalf("only %d pages found: %v", len(pages), pages)
	}
	return pages
}

func readPage(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	fence     = regexp.MustCompile("(?s)```.*?```")
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading   = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	htmlID    = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
	notInSlug = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// pageAnchors are the fragments a page answers to, as GitHub makes them: each
// heading lowercased, without punctuation, spaces as hyphens (a repeated
// one numbered -1, -2, ...), and explicit <a id> anchors.
func pageAnchors(page string) map[string]bool {
	text := fence.ReplaceAllString(page, "")
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		slug := strings.ReplaceAll(notInSlug.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n, dup := seen[slug]; dup {
			seen[slug] = n + 1
			slug += "-" + strconv.Itoa(n+1)
		} else {
			seen[slug] = 0
		}
		out[slug] = true
	}
	for _, m := range htmlID.FindAllStringSubmatch(text, -1) {
		out[m[1]] = true
	}
	return out
}

// TestDocLinks: every relative link of every page names a file or folder of
// the repository, and every #fragment a heading (or <a id>) of its page.
// Links in code blocks are not links.
func TestDocLinks(t *testing.T) {
	links := 0
	anchors := map[string]map[string]bool{} // by page
	for _, page := range docPages(t) {
		text := fence.ReplaceAllString(readPage(t, page), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, frag, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(page), path))
			}
			if strings.HasPrefix(file, "../") {
				t.Errorf("%s: link %s leaves the repository", page, target)
				continue
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: link %s: no such file or folder (%s)", page, target, file)
				continue
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				t.Errorf("%s: link %s: a fragment on a file that is not a page", page, target)
				continue
			}
			if anchors[file] == nil {
				anchors[file] = pageAnchors(readPage(t, file))
			}
			if !anchors[file][frag] {
				t.Errorf("%s: link %s: %s has no heading for #%s", page, target, file, frag)
			}
		}
	}
	if links < 100 {
		t.Errorf("only %d relative links found: is the link pattern still right?", links)
	}
}

// repoPath is a path in backquotes that names a file of the repository:
// a folder, a name and one of the extensions the repository's files have.
var repoPath = regexp.MustCompile("`([A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*\\.(?:go|sh|sql|yaml|yml|json|java|service|md))`")

// TestDocFilesExist: every repository file a reference page (not a measured
// report, which records the files of its time) names in backquotes exists.
func TestDocFilesExist(t *testing.T) {
	for _, page := range docPages(t) {
		if strings.HasPrefix(page, "docs/reports/") {
			continue
		}
		for _, m := range repoPath.FindAllStringSubmatch(readPage(t, page), -1) {
			if _, err := os.Stat(m[1]); err != nil {
				t.Errorf("%s names %s, which does not exist", page, m[1])
			}
		}
	}
}

// fileAndNames is a Go file in backquotes followed by the names of what it
// defines, as docs/architecture.md writes its steps: `dir/file.go`, `Func`,
// `Type.Method`, ...
var fileAndNames = regexp.MustCompile("`([a-z0-9_]+/[a-z0-9_/]*\\.go)`((?:,\\s*`[A-Za-z0-9_.]+`)+)")

// TestArchitectureNamesExist: each function docs/architecture.md names after
// its file is defined in that file, so a step whose code moves or is renamed
// fails here until the page follows.
func TestArchitectureNamesExist(t *testing.T) {
	text := readPage(t, "docs/architecture.md")
	checked := 0
	for _, m := range fileAndNames.FindAllStringSubmatch(text, -1) {
		src := readPage(t, m[1])
		for _, n := range regexp.MustCompile("`([A-Za-z0-9_.]+)`").FindAllStringSubmatch(m[2], -1) {
			name := n[1]
			if strings.HasSuffix(name, ".go") {
				// Another file of the same package.
				if _, err := os.Stat(filepath.Join(filepath.Dir(m[1]), name)); err != nil {
					t.Errorf("docs/architecture.md names %s beside %s: no such file", name, m[1])
				}
				continue
			}
			fn := name[strings.LastIndex(name, ".")+1:]
			if !regexp.MustCompile(`(?m)^func (\([^)]*\) )?` + fn + `[\[(]`).MatchString(src) {
				t.Errorf("docs/architecture.md names %s in %s, which defines no such function", name, m[1])
			}
			checked++
		}
	}
	if checked < 30 {
		t.Errorf("only %d functions checked: is the pattern still right?", checked)
	}
}

// docReference is a docs page named in code, configuration or scripts
// (a fix hint, a comment, a runbook).
var docReference = regexp.MustCompile(`docs/[A-Za-z0-9_/.-]+\.md`)

// TestCodeNamesExistingDocs: every docs page the code, the Makefile, the
// deployment files and the scripts name exists, so a hint never sends an
// operator to a page that moved.
func TestCodeNamesExistingDocs(t *testing.T) {
	found := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "dist", "bench-out", "docs":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, ref := range docReference.FindAllString(string(b), -1) {
			found++
			if _, err := os.Stat(ref); err != nil {
				t.Errorf("%s names %s, which does not exist", path, ref)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Error("no docs page named anywhere: is the pattern still right?")
	}
}

// TestManagedServiceSections: the section of docs/managed-postgres.md
// each managed service's check line and fix name exists.
func TestManagedServiceSections(t *testing.T) {
	anchors := pageAnchors(readPage(t, "docs/managed-postgres.md"))
	for _, s := range []postgres.Service{postgres.RDS, postgres.Aurora, postgres.CloudSQL, postgres.AlloyDB, postgres.Azure, postgres.Neon} {
		if !anchors[s.Section] {
			t.Errorf("%s: %s has no such section", s.Name, s.Doc())
		}
	}
}

// yamlBlocks are a page's ```yaml blocks.
func yamlBlocks(text string) []string {
	var out []string
	for _, b := range strings.Split(text, "```yaml\n")[1:] {
		out = append(out, b[:strings.Index(b, "```")])
	}
	return out
}

// anyValue stands for every ${VAR} of an example.
func anyValue(string) (string, bool) { return "x", true }

// TestDocConfigurations: every complete configuration a page shows (a YAML
// block that starts with origen:) is one outboxd loads.
func TestDocConfigurations(t *testing.T) {
	n := 0
	for _, page := range docPages(t) {
		for _, b := range yamlBlocks(readPage(t, page)) {
			if !strings.HasPrefix(b, "origen:") {
				continue
			}
			n++
			if _, err := config.Parse([]byte(b), anyValue, nil); err != nil {
				t.Errorf("%s: the configuration\n%s: %v", page, b, err)
			}
		}
	}
	if n < 2 {
		t.Errorf("%d complete configurations found, want the README's and the reference's", n)
	}
}

// minimalHead is the README's minimal configuration up to its routes:
// every cookbook example's routes go under it.
func minimalHead(t *testing.T) string {
	t.Helper()
	for _, b := range yamlBlocks(readPage(t, "README.md")) {
		if i := strings.Index(b, "\nroutes:\n"); strings.HasPrefix(b, "origen:") && i > 0 {
			return b[:i+len("\nroutes:\n")]
		}
	}
	t.Fatal("README.md shows no minimal configuration with routes")
	return ""
}

// TestRoutingCookbook: every route of the routing cookbook
// (docs/routing.md) is a valid configuration, so the examples cannot drift
// from the code.
func TestRoutingCookbook(t *testing.T) {
	text := readPage(t, "docs/routing.md")
	start := strings.Index(text, "\n## Cookbook\n")
	if start < 0 {
		t.Fatal("no Cookbook section in docs/routing.md")
	}
	end := strings.Index(text[start+1:], "\n## ")
	if end < 0 {
		t.Fatal("the Cookbook section of docs/routing.md has no end")
	}
	head := minimalHead(t)
	blocks := yamlBlocks(text[start : start+1+end])
	if len(blocks) < 8 {
		t.Fatalf("%d YAML examples in the cookbook, want one per mode", len(blocks))
	}
	for _, routes := range blocks {
		// A cookbook example whose filter needs a route without one gets
		// the seed's.
		yml := head + routes
		if strings.Contains(routes, "filter:") && strings.Count(routes, "- table:") == 1 {
			yml += "  - table: " + strings.Fields(routes)[2] + "\n    topic: main\n"
		}
		if _, err := config.Parse([]byte(yml), anyValue, nil); err != nil {
			t.Errorf("cookbook example\n%s: %v", routes, err)
		}
	}
}
