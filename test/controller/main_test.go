package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

// Shared by every test of the package; set up once in TestMain.
var (
	repoRoot   string
	bins       testutil.Binaries // the real binaries, built once
	tmpDir     string
	kubectl    testutil.Tool // bin/k8s/kubectl as the envtest admin
	ctrlConfig string        // kubeconfig of the controller's service account user
	pushToken  string        // the controller's --push-token-file
	auditLog   string        // the API server's audit log of Secret requests
	jwksCA     *testCA       // the CA of --jwks-ca-file: test identity providers' certificates
	k8s        client.Client
	testEnv    *envtest.Environment
	ctrlProc   *controllerProcess
	kc         *cluster.Cluster     // kube-controller-manager, kube-scheduler and kwok
	clientset  kubernetes.Interface // for the per-test pod networks' informers
	podNet     *cluster.Network     // the model pods' default network, relaying to sim
	sim        *testutil.Process    // the default model server behind podNet
)

// The pod lifecycle's delays on this suite's kwok Nodes: short, since the
// tests are about the controller, not the model's cold start (tests that
// need a pod to stay unready say so on the pod's template).
var suiteStages = cluster.StageOptions{
	ColdStart:        100 * time.Millisecond,
	TerminationDelay: 300 * time.Millisecond,
	CrashDetection:   100 * time.Millisecond,
}

// controllerNamespace holds the controller's RBAC and its leader Lease.
const controllerNamespace = "tiergate-system"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := setUp(); err != nil {
		fmt.Fprintln(os.Stderr, "test/controller:", err)
		_ = tearDown()
		return 1
	}
	code := m.Run()
	if code != 0 && kc != nil {
		fmt.Fprintln(os.Stderr, kc.Logs(30))
	}
	// Least privilege must still be enough: any refusal by RBAC fails.
	if ctrlProc != nil {
		if refused := rbacRefusals(ctrlProc.Output()); len(refused) > 0 {
			fmt.Fprintf(os.Stderr, "test/controller: the controller was refused by RBAC %d times; the first:\n%s\n", len(refused), refused[0])
			code = 1
		}
	}
	if code != 0 && ctrlProc != nil {
		fmt.Fprintf(os.Stderr, "--- controller log (last 60 lines) ---\n%s\n", ctrlProc.tail(60))
	}
	if err := tearDown(); err != nil && code == 0 {
		code = 1
	}
	return code
}

func tearDown() error {
	var firstErr error
	if ctrlProc != nil {
		ctrlProc.stop()
	}
	if kc != nil {
		if err := kc.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "test/controller: stopping the cluster:", err)
			firstErr = err
		}
	}
	if sim != nil {
		sim.Stop(5 * time.Second)
	}
	if testEnv != nil {
		if err := testEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "test/controller: stopping the control plane:", err)
			firstErr = err
		}
	}
	if tmpDir != "" {
		_ = os.RemoveAll(tmpDir)
	}
	return firstErr
}

func setUp() error {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return err
	}
	repoRoot = root
	assets, err := controlplane.Assets(root)
	if err != nil {
		return err
	}
	if tmpDir, err = os.MkdirTemp("", "tiergate-controller-e2e-"); err != nil {
		return err
	}

	// The real binaries: the controller and dispatcher are one binary.
	if bins, err = testutil.BuildBinaries(tmpDir, testutil.BuildOptions{}); err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	// Every request for a Secret is audited, with its answer, so tests can
	// show which Secrets the controller asked for and received.
	auditPolicy := filepath.Join(tmpDir, "audit-policy.yaml")
	if err := os.WriteFile(auditPolicy, []byte(secretsAuditPolicy), 0o600); err != nil {
		return err
	}
	auditLog = filepath.Join(tmpDir, "audit.log")
	var cfg *rest.Config
	opts := append(cluster.APIServerOptions(),
		controlplane.WithAPIServerFlag("audit-policy-file", auditPolicy),
		controlplane.WithAPIServerFlag("audit-log-path", auditLog),
		controlplane.WithAPIServerFlag("audit-log-format", "json"))
	if testEnv, cfg, err = controlplane.Start(root, assets, scheme, opts...); err != nil {
		return err
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	adminConfig := filepath.Join(tmpDir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(testEnv, nil, adminConfig); err != nil {
		return err
	}
	kubectl = testutil.Kubectl(filepath.Join(assets, "kubectl"), adminConfig)
	if err := startCluster(cfg, assets); err != nil {
		return err
	}

	// The controller runs as its ServiceAccount's user name, with exactly
	// the RBAC of config/rbac: a missing rule fails these tests.
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: controllerNamespace}}); err != nil {
		return err
	}
	if r := kubectl.Run("apply", "-n", controllerNamespace, "-k", filepath.Join(root, "config", "rbac")); r.Err != nil {
		return errors.New(r.String())
	}
	ctrlConfig = filepath.Join(tmpDir, "controller.kubeconfig")
	if err := controlplane.WriteKubeconfig(testEnv, &envtest.User{
		Name:   "system:serviceaccount:" + controllerNamespace + ":tiergate-controller",
		Groups: []string{"system:serviceaccounts", "system:authenticated"},
	}, ctrlConfig); err != nil {
		return err
	}
	pushToken = filepath.Join(tmpDir, "push-token")
	if err := os.WriteFile(pushToken, []byte("e2e-push-token-0123456789\n"), 0o600); err != nil {
		return err
	}
	if jwksCA, err = newTestCA(filepath.Join(tmpDir, "jwks-ca.pem")); err != nil {
		return err
	}
	ctrlProc, err = startController()
	return err
}

// controllerProcess is `tiergate controller` running as a child process.
type controllerProcess struct {
	*testutil.Process
	probeAddr string
	metrics   string
}

func (c *controllerProcess) tail(n int) string { return testutil.LastLines(c.Output(), n) }

// startController starts the controller and waits until it leads.
func startController() (*controllerProcess, error) {
	ports, err := testutil.FreePorts("127.0.0.1", 2)
	if err != nil {
		return nil, err
	}
	c := &controllerProcess{
		probeAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]),
		metrics:   fmt.Sprintf("127.0.0.1:%d", ports[1]),
	}
	cmd := exec.Command(bins.Tiergate, "controller",
		"--kubeconfig", ctrlConfig,
		"--leader-elect=true",
		"--leader-election-namespace", controllerNamespace,
		"--metrics-bind-address", c.metrics,
		"--health-probe-bind-address", c.probeAddr,
		"--push-token-file", pushToken,
		"--resync-period", "500ms",
		"--push-timeout", "1s",
		"--jwks-ca-file", jwksCA.file,
		"--jwks-min-refetch-interval", "1s",
		"--zap-log-level", logLevel(),
	)
	if c.Process, err = testutil.Start(cmd); err != nil {
		return nil, err
	}
	err = c.AwaitOutput(30*time.Second, func(out string) bool {
		return strings.Contains(strings.ToLower(out), "successfully acquired lease")
	})
	if err == nil {
		err = testutil.Poll(10*time.Second, func() error {
			resp, err := http.Get("http://" + c.probeAddr + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/readyz: %s", resp.Status)
			}
			return nil
		})
	}
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("the controller did not lead and become ready: %w\n%s", err, c.tail(40))
	}
	return c, nil
}

// stop sends SIGTERM and waits; SIGKILL after 10s.
func (c *controllerProcess) stop() { c.Stop(10 * time.Second) }

// logLevel is the controller's --zap-log-level; TIERGATE_E2E_LOG_LEVEL=debug
// helps when a test fails.
func logLevel() string {
	if l := os.Getenv("TIERGATE_E2E_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}

// rbacRefusals are the lines of a controller log that say the API server
// refused it something: a 403 "forbidden". A namespace being deleted also
// refuses new objects with a 403 (an Event of a pool whose test just
// ended), which is the namespace's lifecycle, not RBAC.
func rbacRefusals(log string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "forbidden") && !strings.Contains(line, "because it is being terminated") {
			out = append(out, line)
		}
	}
	return out
}

func TestRBACRefusals(t *testing.T) {
	log := `{"msg":"ok"}
{"msg":"Server rejected event (will not retry!)","error":"events.events.k8s.io \"llm.1\" is forbidden: unable to create new content in namespace e2e-a because it is being terminated"}
{"msg":"Reconciler error","error":"deployments.apps \"llm\" is forbidden: User \"system:serviceaccount:tiergate-system:tiergate-controller\" cannot get resource \"deployments\" in API group \"apps\" in the namespace \"e2e-b\""}`
	got := rbacRefusals(log)
	if len(got) != 1 || !strings.Contains(got[0], `cannot get resource \"deployments\"`) {
		t.Errorf("refusals %q, want the Deployment's only", got)
	}
}
