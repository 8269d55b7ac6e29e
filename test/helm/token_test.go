package helm

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tiergate/tiergate/internal/testutil"
)

// tokenEnv is a GitOps-style deployment of the chart: two `helm template`
// renders applied with kubectl, the real controller as the chart's
// ServiceAccount and one real dispatcher, each reading the push token from
// a volume laid out and swapped as the kubelet does.
type tokenEnv struct {
	t          *testing.T
	ns         string
	secret     string
	ctrlVol    *testutil.SecretVolume
	dispVol    *testutil.SecretVolume
	controller *testutil.Process
	dispatcher *testutil.Process
	pod, admin string // the dispatcher's pod and its admin address
}

const tplRelease = "tpl"

// renderTwice renders the chart twice with helm template (no cluster, so
// no lookup), checks the renders are the same and hold no Secret, and
// applies the chart's CRDs as GitOps tools apply them. apply applies a
// render; cleanup deletes what it made.
func renderTwice(t *testing.T, ns string) (first, second string, apply func(string)) {
	t.Helper()
	args := []string{"template", tplRelease, chartDir, "--namespace", ns, "--kube-version", kubeVersion, "--set", "dispatcher.replicas=1"}
	first, second = helm(t, args...), helm(t, args...)
	if first != second {
		t.Fatalf("two renders differ:\n%s", testutil.LastLines(first, 20))
	}
	for _, o := range parseDocs(t, first) {
		if o.GetKind() == "Secret" {
			t.Fatalf("helm template rendered Secret %s", o.GetName())
		}
	}
	kubectl(t, "apply", "-f", filepath.Join(chartDir, "crds"))
	kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/modelpools.tiergate.dev", "crd/tenantquotas.tiergate.dev", "crd/servicetiers.tiergate.dev")
	dir := t.TempDir()
	n := 0
	apply = func(render string) {
		t.Helper()
		n++
		path := filepath.Join(dir, fmt.Sprintf("render-%d.yaml", n))
		if err := os.WriteFile(path, []byte(render), 0o600); err != nil {
			t.Fatal(err)
		}
		kubectl(t, "apply", "-f", path)
		if n == 1 {
			t.Cleanup(func() { kubectl(t, "delete", "-f", path, "--ignore-not-found", "--wait=false") })
		}
	}
	return first, second, apply
}

// startController runs the rendered controller's arguments as its
// ServiceAccount, with its token volume empty: the Secret does not exist
// yet, and the chart makes the volume optional.
func (e *tokenEnv) startController(manifest string) {
	t := e.t
	deploy := find(t, parseDocs(t, manifest), "Deployment", tplRelease+"-tiergate-controller")
	sa := "system:serviceaccount:" + e.ns + ":" + field[string](t, deploy, "spec", "template", "spec", "serviceAccountName")
	e.ctrlVol = testutil.NewSecretVolume(t, map[string]string{})
	probe := testutil.FreeAddr(t, "127.0.0.1")
	argv := rewrite(t, args(t, deploy), map[string]string{
		"metrics-bind-address":      "0",
		"health-probe-bind-address": probe,
		"push-token-file":           e.ctrlVol.Path("token"),
	})
	argv = append(argv, "--kubeconfig="+impersonating(t, e.ns, sa), "--resync-period=1s")
	e.controller = start(t, argv)
	testutil.WaitHTTP(t, e.controller, "http://"+probe+"/readyz", http.StatusOK, 60*time.Second)
}

// startDispatcher runs the rendered dispatcher's arguments, with a short
// grace, on the address kwok gave the rendered Deployment's pod.
func (e *tokenEnv) startDispatcher(manifest, token string) {
	t := e.t
	deploy := find(t, parseDocs(t, manifest), "Deployment", tplRelease+"-tiergate-dispatcher")
	var ip string
	e.pod, ip = e.dispatcherPod(deploy)
	e.admin = testutil.FreeAddr(t, ip)
	e.dispVol = testutil.NewSecretVolume(t, map[string]string{"token": token})
	argv := rewrite(t, args(t, deploy), map[string]string{
		"listen":           testutil.FreeAddr(t, "127.0.0.1"),
		"admin-listen":     e.admin,
		"admin-token-file": e.dispVol.Path("token"),
		"drain-timeout":    "1s",
	})
	e.dispatcher = start(t, append(argv, "--admin-token-grace=5s"))
	testutil.WaitHTTP(t, e.dispatcher, "http://"+e.admin+"/healthz", http.StatusOK, 20*time.Second)
}

// dispatcherPod waits for the one pod of the dispatcher Deployment deploy
// (made by the ReplicaSet controller, scheduled, started by kwok) and
// returns its name and IP.
func (e *tokenEnv) dispatcherPod(deploy *unstructured.Unstructured) (name, ip string) {
	t := e.t
	t.Helper()
	labels := field[map[string]any](t, deploy, "spec", "template", "metadata", "labels")
	var sel []string
	for k, v := range labels {
		sel = append(sel, k+"="+v.(string))
	}
	testutil.Eventually(t, 30*time.Second, "the dispatcher pod gets an address", func() error {
		pods, err := adminClientset(t).CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: strings.Join(sel, ",")})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
			return fmt.Errorf("%d pods, the first %+v", len(pods.Items), pods.Items)
		}
		name, ip = pods.Items[0].Name, pods.Items[0].Status.PodIP
		return nil
	})
	return name, ip
}

// applied counts the pushes the dispatcher applied.
func (e *tokenEnv) applied() int {
	return strings.Count(e.dispatcher.Output(), `"msg":"applied policy"`)
}

// waitApplied waits for n more applied pushes than since.
func (e *tokenEnv) waitApplied(since, n int, what string) {
	e.t.Helper()
	e.dispatcher.WaitOutput(e.t, 20*time.Second, what, func(out string) bool {
		return strings.Count(out, `"msg":"applied policy"`) >= since+n
	})
}

// synced waits for the pool's Synced condition to have reason, and
// returns its message.
func (e *tokenEnv) synced(reason string) string {
	e.t.Helper()
	var msg string
	testutil.Eventually(e.t, 30*time.Second, "Synced "+reason, func() error {
		out := kubectl(e.t, "get", "modelpool", "llm", "-n", e.ns, "-o", `jsonpath={.status.conditions[?(@.type=="Synced")]}`)
		var c metav1.Condition
		if out == "" {
			return fmt.Errorf("no Synced condition")
		}
		if err := json.Unmarshal([]byte(out), &c); err != nil {
			return err
		}
		if c.Reason != reason {
			return fmt.Errorf("Synced %s/%s: %s", c.Status, c.Reason, c.Message)
		}
		msg = c.Message
		return nil
	})
	return msg
}

// accepts waits until the dispatcher takes token on its admin API.
func (e *tokenEnv) accepts(token string) {
	e.t.Helper()
	testutil.Eventually(e.t, 10*time.Second, "the dispatcher accepts the new token", func() error {
		if code, body := httpDo(e.t, http.MethodGet, "http://"+e.admin+"/v1/stats", token, nil); code != http.StatusOK {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
}

// token is the Secret's token, "" while there is none.
func (e *tokenEnv) token() string {
	e.t.Helper()
	sec, err := adminClientset(e.t).CoreV1().Secrets(e.ns).Get(context.Background(), e.secret, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return string(sec.Data["token"])
}

// rotate writes a new token into the Secret, as a user rotating it does.
func (e *tokenEnv) rotate(token string) {
	e.t.Helper()
	kubectl(e.t, "patch", "secret", e.secret, "-n", e.ns, "--type=merge", "-p", fmt.Sprintf(`{"stringData":{"token":%q}}`, token))
}

// Rendering the chart twice with helm template and applying both breaks
// no push: the renders carry no token, the controller creates the Secret,
// and the real dispatcher, on the address kwok gave the rendered
// Deployment's pod and reading the Secret from its volume, takes the
// controller's pushes. Rotations then converge in either order, because a
// dispatcher still accepts the replaced token for its grace and the
// controller retries a refused push with the replaced one; a token the
// dispatcher refuses shows as Synced=False PushUnauthorized.
func TestTemplateTwiceThenRotate(t *testing.T) {
	const ns = "tg-template"
	controlPlane(t)
	kubectl(t, "create", "namespace", ns)
	manifest, second, apply := renderTwice(t, ns)
	apply(manifest)
	startCluster(t)
	e := &tokenEnv{t: t, ns: ns, secret: tplRelease + "-tiergate-push-token"}
	e.startController(manifest)

	// The controller creates the Secret; the kubelet then fills in both
	// volumes.
	var t1 string
	testutil.Eventually(t, 30*time.Second, "the controller creates the token Secret", func() error {
		if t1 = e.token(); len(t1) != 48 {
			return fmt.Errorf("token %d bytes", len(t1))
		}
		return nil
	})
	e.ctrlVol.Update(map[string]string{"token": t1})
	e.startDispatcher(manifest, t1)
	applySamplesFor(t, ns, e.admin)
	e.waitApplied(0, 1, "the first push")
	e.synced("AllDispatchersSynced")

	// The second render, applied while everything runs, leaves the token
	// and the pushes alone.
	apply(second)
	if got := e.token(); got != t1 {
		t.Fatalf("the token changed from %q to %q when the second render was applied", t1, got)
	}
	e.waitApplied(e.applied(), 3, "pushes after the second render")
	e.synced("AllDispatchersSynced")
	e.rotations(t1)
}

func (e *tokenEnv) rotations(t1 string) {
	t := e.t
	t.Run("the dispatcher sees the new token first", func(t *testing.T) {
		const t2 = "rotated-token-two-0123456789abcdefghijklmnop"
		e.rotate(t2)
		e.dispVol.Update(map[string]string{"token": t2})
		e.accepts(t2)
		n := e.applied()
		e.waitApplied(n, 1, "a push with the replaced token within the grace")
		e.ctrlVol.Update(map[string]string{"token": t2})
		n = e.applied()
		e.waitApplied(n, 8, "pushes with the new token after the grace")
		e.synced("AllDispatchersSynced")
	})
	t.Run("the controller sees the new token first", func(t *testing.T) {
		const t3 = "rotated-token-three-0123456789abcdefghijklmn"
		e.rotate(t3)
		e.ctrlVol.Update(map[string]string{"token": t3})
		n := e.applied()
		e.waitApplied(n, 2, "pushes retried with the replaced token")
		e.dispVol.Update(map[string]string{"token": t3})
		n = e.applied()
		e.waitApplied(n, 8, "pushes with the new token")
		e.synced("AllDispatchersSynced")
	})
	t.Run("a token the dispatcher refuses", func(t *testing.T) {
		e.dispVol.Update(map[string]string{"token": "a-token-the-controller-never-sees-0123456789"})
		msg := e.synced("PushUnauthorized")
		want := e.pod + " refused the push token (401) and will take no new policy; 1/1 dispatchers hold policy version "
		if !strings.HasPrefix(msg, want) || !strings.Contains(msg, "check the push token Secret "+e.ns+"/"+e.secret+":") {
			t.Errorf("Synced message %q, want it to start %q and name the Secret", msg, want)
		}
		e.dispVol.Update(map[string]string{"token": "rotated-token-three-0123456789abcdefghijklmn"})
		e.synced("AllDispatchersSynced")
	})
	if strings.Contains(e.controller.Output(), "forbidden") {
		t.Errorf("the controller was refused by RBAC:\n%s", testutil.LastLines(e.controller.Output(), 30))
	}
	for _, tok := range []string{t1, "rotated-token"} {
		if strings.Contains(e.controller.Output()+e.dispatcher.Output(), tok) {
			t.Errorf("a log holds a push token")
		}
	}
}

// applySamplesFor applies config/samples to ns with the ModelPool's admin
// port set to that of admin (host:port).
func applySamplesFor(t *testing.T, ns, admin string) {
	t.Helper()
	_, port, err := net.SplitHostPort(admin)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(repoRoot, "config", "samples", "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("config/samples: %v, %d files", err, len(files))
	}
	var docs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if strings.Contains(s, "kind: ModelPool") {
			if strings.Count(s, "adminPort: 9090") != 1 {
				t.Fatalf("%s does not set adminPort: 9090 once", f)
			}
			s = strings.Replace(s, "adminPort: 9090", "adminPort: "+port, 1)
		}
		docs = append(docs, s)
	}
	kube(t).MustInput(t, strings.Join(docs, "\n---\n"), "apply", "-n", ns, "-f", "-")
}
