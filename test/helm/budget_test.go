package helm

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tiergate/tiergate/internal/testutil"
)

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnv replaces $(VAR) in args with the container's env VAR, as the
// kubelet does: a literal value, or a resourceFieldRef resolved against
// the container's own resources (in bytes for memory, with its divisor).
// A reference to anything else stays as written.
func expandEnv(t *testing.T, c map[string]any, args []string) []string {
	t.Helper()
	env := map[string]string{}
	envList, _ := c["env"].([]any)
	for _, e := range envList {
		e := e.(map[string]any)
		name := e["name"].(string)
		if v, ok := e["value"].(string); ok {
			env[name] = v
			continue
		}
		from, _ := e["valueFrom"].(map[string]any)
		ref, _ := from["resourceFieldRef"].(map[string]any)
		if ref == nil {
			continue
		}
		env[name] = resourceField(t, c, ref)
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = envRef.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	return out
}

// resourceField is what the downward API gives for ref: the container's
// limits.X or requests.X divided by the divisor (default 1), rounded up.
func resourceField(t *testing.T, c map[string]any, ref map[string]any) string {
	t.Helper()
	kind, res, _ := strings.Cut(ref["resource"].(string), ".")
	q, ok := c["resources"].(map[string]any)[kind].(map[string]any)[res]
	if !ok {
		t.Fatalf("resourceFieldRef %v: the container sets no %s.%s (the kubelet would give the node's allocatable)", ref, kind, res)
	}
	v := resource.MustParse(fmt.Sprint(q))
	div := resource.MustParse("1")
	if d, ok := ref["divisor"]; ok {
		div = resource.MustParse(fmt.Sprint(d))
	}
	n := (v.Value() + div.Value() - 1) / div.Value()
	return fmt.Sprint(n)
}

// The chart hands the container's memory limit to the dispatcher through
// the downward API, so the dispatcher's default body budget is a quarter
// of it; without a limit it passes nothing; maxQueuedBytes is passed as is.
func TestChartPassesTheMemoryLimit(t *testing.T) {
	limitEnv := []any{map[string]any{"name": "TIERGATE_MEMORY_LIMIT", "valueFrom": map[string]any{
		"resourceFieldRef": map[string]any{"containerName": "dispatcher", "resource": "limits.memory"}}}}
	for name, tc := range map[string]struct {
		set      []string
		wantEnv  []any
		wantArgs []string // the budget's flags, expanded
	}{
		"default: 512Mi": {wantEnv: limitEnv, wantArgs: []string{"--memory-limit=536870912"}},
		"a 1Gi limit":    {set: []string{"--set", "dispatcher.resources.limits.memory=1Gi"}, wantEnv: limitEnv, wantArgs: []string{"--memory-limit=1073741824"}},
		"no limit":       {set: []string{"--set", "dispatcher.resources=null"}},
		"an explicit budget, and extraEnv after the limit": {
			set:      []string{"--set", "dispatcher.maxQueuedBytes=67108864", "--set", "dispatcher.extraEnv[0].name=GOGC", "--set-string", "dispatcher.extraEnv[0].value=50"},
			wantEnv:  append(append([]any{}, limitEnv...), map[string]any{"name": "GOGC", "value": "50"}),
			wantArgs: []string{"--max-queued-bytes=67108864", "--memory-limit=536870912"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			deploy := find(t, render(t, tc.set...), "Deployment", "tiergate-dispatcher")
			env, _ := container(t, deploy)["env"].([]any)
			if diff := cmp.Diff(tc.wantEnv, env); diff != "" {
				t.Errorf("env (-want +got)\n%s", diff)
			}
			var got []string
			for _, a := range args(t, deploy) {
				if strings.HasPrefix(a, "--memory-limit") || strings.HasPrefix(a, "--max-queued-bytes") {
					got = append(got, a)
				}
			}
			if diff := cmp.Diff(tc.wantArgs, got); diff != "" {
				t.Errorf("budget flags (-want +got)\n%s", diff)
			}
		})
	}
}

// The real dispatcher, started with the chart's default arguments as the
// kubelet would expand them, takes a quarter of the 512Mi limit.
func TestDispatcherBudgetFromChart(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("chart-budget-test-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	data, admin := testutil.FreeAddr(t, "127.0.0.1"), testutil.FreeAddr(t, "127.0.0.1")
	argv := rewrite(t, args(t, find(t, render(t), "Deployment", "tiergate-dispatcher")), map[string]string{
		"listen": data, "admin-listen": admin, "admin-token-file": tokenFile,
	})
	p := start(t, argv)
	testutil.WaitHTTP(t, p, "http://"+admin+"/healthz", http.StatusOK, 20*time.Second)
	want := `"msg":"queued body budget","bytes":134217728,"from":"a quarter of --memory-limit (512 MiB)"`
	if !strings.Contains(p.Output(), want) {
		t.Errorf("the dispatcher's log lacks %s:\n%s", want, p.Output())
	}
	p.StopClean(t, 40*time.Second)
}
