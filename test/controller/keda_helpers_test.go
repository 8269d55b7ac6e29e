package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/controllers"
)

// kedaCRD is KEDA's own ScaledObject CRD, which hack/tools.sh copies from
// the pinned github.com/kedacore/keda/v2 module.
func kedaCRD(t *testing.T) string {
	t.Helper()
	p := filepath.Join(repoRoot, "bin", "keda", "keda.sh_scaledobjects.yaml")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("KEDA's ScaledObject CRD is missing (%v); run `make tools` (or hack/tools.sh keda) first", err)
	}
	return p
}

// installKEDA applies KEDA's CRD with kubectl and waits until it serves.
func installKEDA(t *testing.T) {
	t.Helper()
	kubectl.Must(t, "apply", "--server-side", "-f", kedaCRD(t))
	kubectl.Must(t, "wait", "--for=condition=Established", "--timeout=30s", "crd/scaledobjects.keda.sh")
}

// uninstallKEDA deletes KEDA's CRD, if installed, and waits until it is
// gone.
func uninstallKEDA(t *testing.T) {
	t.Helper()
	kubectl.Must(t, "delete", "--ignore-not-found", "--wait=true", "--timeout=60s", "-f", kedaCRD(t))
}

// scaledObject reads the pool's ScaledObject; nil when there is none.
func scaledObject(t *testing.T, ns, name string) (*unstructured.Unstructured, error) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(controllers.ScaledObjectGVK)
	err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return u, err
}

// fakeDispatcher is a dispatcher's admin API that accepts every valid
// policy and acknowledges it with the stats the test sets: it plays the
// dispatcher side of the offered-load report with the real wire types.
type fakeDispatcher struct {
	srv   *httptest.Server
	token string

	mu    sync.Mutex
	stats policy.Measured
	last  *policy.Policy
}

// startFakeDispatcher serves the fake on the admin port of pod's address.
func (e *env) startFakeDispatcher(pod *dispatcher, tokenFile string) *fakeDispatcher {
	e.t.Helper()
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		e.t.Fatal(err)
	}
	f := &fakeDispatcher{token: strings.TrimSpace(string(b))}
	ln, err := net.Listen("tcp", net.JoinHostPort(pod.ip, fmt.Sprint(e.adminPort)))
	if err != nil {
		e.t.Fatal(err)
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Listener = ln
	f.srv.Start()
	e.t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeDispatcher) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut || r.URL.Path != "/v1/policy" {
		http.Error(w, "not here", http.StatusNotFound)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		http.Error(w, "no", http.StatusUnauthorized)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p, err := policy.DecodeAndValidate(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.last = p
	ack := policy.Ack{Version: p.Version, Stats: f.stats}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ack)
}

// report sets what the next acknowledgements carry.
func (f *fakeDispatcher) report(m policy.Measured) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats = m
}

func (f *fakeDispatcher) policy() *policy.Policy {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// controllerSeries returns the controller's exposition lines of name for
// the pool, read from its /metrics endpoint.
func controllerSeries(t *testing.T, name, pool string) []string {
	t.Helper()
	resp, err := http.Get("http://" + ctrlProc.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, `pool="`+pool+`"`) {
			out = append(out, line)
		}
	}
	return out
}
