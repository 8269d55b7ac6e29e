package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// subnet hands every test environment its own 127.77.N.0/24, so tests
// never collide on an address.
var subnet atomic.Int32

// procOpts name a child process; Cleanup stops it (SIGTERM, SIGKILL after
// 10s) and logs its output if the test failed.
func procOpts(name string) testutil.Options {
	return testutil.Options{Name: name, Grace: 10 * time.Second}
}

// dispatcher is a dispatcher pod of config/dispatcher's Deployment, with
// the address kwok gave it, and the real `tiergate dispatcher` process on
// that address (nil until it runs).
type dispatcher struct {
	*testutil.Dispatcher
	pod string
	ip  string
}

// env is one test's namespace, ports and processes.
type env struct {
	t         *testing.T
	ns        string
	net       int32 // the N of 127.77.N.0/24, the test clients' own addresses
	adminPort int
	dataPort  int
	modelPort int // the port of the model pods' network
	disp      []*dispatcher
	seen      map[string]bool // the dispatcher pods handed out so far
	applied   bool            // the samples are applied
	readyAt   time.Time       // when scale first saw the Deployment report its readyReplicas
	kubelet   *kubelet        // the probe loop, in a probed env only
}

// newEnv creates a namespace and picks the dispatchers' admin and data
// ports, free on every address of the pod CIDR. Its model pods are served
// by the suite's default model server unless the test calls serveModels.
func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, net: subnet.Add(1), modelPort: podNet.Port(), seen: map[string]bool{}}
	e.ns = fmt.Sprintf("e2e-%s-%d", strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-")), e.net)
	if len(e.ns) > 60 {
		e.ns = e.ns[len(e.ns)-60:]
		e.ns = "e" + strings.TrimLeft(e.ns, "-")
	}
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The pool goes first so the controller stops pushing; the
		// namespace controller deletes the rest.
		_ = k8s.DeleteAllOf(ctx, &v1alpha1.ModelPool{}, client.InNamespace(e.ns))
		if err := k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}); err != nil {
			t.Errorf("deleting namespace %s: %v", e.ns, err)
		}
	})
	// The ServiceAccount admission plugin refuses pods until the
	// serviceaccount controller has made the namespace's default one.
	testutil.Eventually(t, 10*time.Second, "the default ServiceAccount", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "default"}, &corev1.ServiceAccount{})
	})
	addrs := podAddrs()
	ports, err := testutil.FreePorts(addrs[0], 2, addrs[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	e.adminPort, e.dataPort = ports[0], ports[1]
	return e
}

// ip returns 127.77.N.host: an address of this test's clients.
func (e *env) ip(host int) string { return fmt.Sprintf("127.77.%d.%d", e.net, host) }

// run starts bin as d's dispatcher on d.ip with e's ports and waits for
// /healthz.
func (d *dispatcher) run(e *env, bin, tokenFile string) {
	e.t.Helper()
	d.Dispatcher = testutil.StartDispatcher(e.t, bin, testutil.DispatcherOptions{
		Options: procOpts("dispatcher " + d.pod),
		Data:    net.JoinHostPort(d.ip, fmt.Sprint(e.dataPort)), Admin: net.JoinHostPort(d.ip, fmt.Sprint(e.adminPort)),
		TokenFile: tokenFile, Args: []string{"--drain-timeout", "1s"},
	})
}

// pushes counts the policies d was pushed and applied, resyncs included.
func (d *dispatcher) pushes() int { return strings.Count(d.Output(), `"msg"="applied policy"`) }

// waitPushes waits until d has applied n more pushes than it had when
// pushes said since.
func (d *dispatcher) waitPushes(t *testing.T, since, n int) {
	t.Helper()
	d.WaitOutput(t, 10*time.Second, fmt.Sprintf("%s applies %d more pushes", d.pod, n), func(out string) bool {
		return strings.Count(out, `"msg"="applied policy"`) >= since+n
	})
}

func podIsReady(ns, name string) (bool, error) {
	var pod corev1.Pod
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
		return false, err
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// applySamples applies config/samples with bin/k8s/kubectl, with the
// pool's admin and backend ports and the model server's port set to this
// environment's, each mutate applied to the ModelPool, and the model
// Deployment at 0 replicas: scale says how many run.
func (e *env) applySamples(mutate ...func(string) string) {
	e.t.Helper()
	dir := filepath.Join(repoRoot, "config", "samples")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 4 {
		e.t.Fatalf("config/samples: %v, %d files", err, len(files))
	}
	var docs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			e.t.Fatal(err)
		}
		s := string(b)
		if strings.Contains(s, "kind: ModelPool") {
			s = replaceOnce(e.t, s, "adminPort: 9090", fmt.Sprintf("adminPort: %d", e.adminPort))
			s = replaceOnce(e.t, s, "port: 8000", fmt.Sprintf("port: %d", e.modelPort))
			for _, m := range mutate {
				s = m(s)
			}
		}
		if strings.Contains(s, "kind: Deployment") {
			s = replaceOnce(e.t, s, "  replicas: 6\n", "  replicas: 0\n")
			s = replaceOnce(e.t, s, "--port=8000", fmt.Sprintf("--port=%d", e.modelPort))
			s = replaceOnce(e.t, s, "containerPort: 8000", fmt.Sprintf("containerPort: %d", e.modelPort))
		}
		docs = append(docs, s)
	}
	e.applied = true
	kubectl.MustInput(e.t, strings.Join(docs, "\n---\n"), "apply", "-n", e.ns, "-f", "-")
}

func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if strings.Count(s, old) != 1 {
		t.Fatalf("sample does not contain %q exactly once", old)
	}
	return strings.Replace(s, old, new, 1)
}

// getPolicy reads a dispatcher's applied policy through its admin API.
func getPolicy(d *dispatcher) (*policy.Policy, error) {
	req, _ := http.NewRequest(http.MethodGet, d.AdminURL("/v1/policy"), nil)
	req.Header.Set("Authorization", "Bearer "+d.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/v1/policy: %d %s", d.Admin, resp.StatusCode, b)
	}
	var p policy.Policy
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func (e *env) pool() *v1alpha1.ModelPool {
	e.t.Helper()
	var p v1alpha1.ModelPool
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "llm"}, &p); err != nil {
		e.t.Fatal(err)
	}
	return &p
}

func condition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// conditionIs returns nil when the condition has the status and reason.
func conditionIs(conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) error {
	c := condition(conds, typ)
	if c == nil {
		return fmt.Errorf("no %s condition", typ)
	}
	if c.Status != status || c.Reason != reason {
		return fmt.Errorf("%s is %s/%s (%s), want %s/%s", typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return nil
}

// allHold waits until every dispatcher in ds holds a policy that check
// accepts, and returns how long that took.
func allHold(ds []*dispatcher, timeout time.Duration, check func(*policy.Policy) error) (time.Duration, error) {
	start := time.Now()
	err := testutil.Poll(timeout, func() error {
		for _, d := range ds {
			p, err := getPolicy(d)
			if err != nil {
				return err
			}
			if err := check(p); err != nil {
				return fmt.Errorf("%s: %w", d.pod, err)
			}
		}
		return nil
	})
	return time.Since(start), err
}

var errMismatch = errors.New("mismatch")

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content+"\n"), 0o600) }
