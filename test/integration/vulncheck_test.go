package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestVulncheckDatabase runs the govulncheck and offline database that
// `make vulncheck` uses on two fixture modules that call
// golang.org/x/image/tiff.Decode: one at a release with advisory
// GO-2026-4815 and three more tiff advisories, one at a fixed release. So the check is shown to catch
// a reachable vulnerability and to pass a fixed one, from bin/vulndb alone.
func TestVulncheckDatabase(t *testing.T) {
	t.Parallel()
	govulncheck := filepath.Join(repoRoot, "bin", "govulncheck")
	db := filepath.Join(repoRoot, "bin", "vulndb")
	for _, p := range []string{govulncheck, filepath.Join(db, "index", "db.json")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v (run make tools)", err)
		}
	}
	found := regexp.MustCompile(`Vulnerability #\d+: (GO-\d+-\d+)`)
	tests := map[string]struct {
		dir      string
		wantCode int
		wantIDs  []string
	}{
		// sfnt's GO-2026-4962 is in the same module but not imported: only
		// reachable symbols count.
		"x/image v0.30.0": {dir: "vulnerable", wantCode: 3, wantIDs: []string{"GO-2026-5066", "GO-2026-5062", "GO-2026-5032", "GO-2026-4815"}},
		"x/image v0.48.0": {dir: "fixed", wantCode: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(repoRoot, "test", "integration", "testdata", "vulncheck", tc.dir)
			stdout, stderr, code := script(t, dir, "env", "GOFLAGS=-mod=mod", "GOWORK=off",
				govulncheck, "-db", "file://"+db, "./...")
			var ids []string
			for _, m := range found.FindAllStringSubmatch(stdout, -1) {
				ids = append(ids, m[1])
			}
			if diff := cmp.Diff([]any{tc.wantCode, tc.wantIDs}, []any{code, ids}); diff != "" {
				t.Errorf("exit code, reachable advisories (-want +got):\n%s\nstdout:\n%s\nstderr:\n%s", diff, stdout, stderr)
			}
		})
	}
}
