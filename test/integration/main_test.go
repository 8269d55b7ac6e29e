package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	tiergatev1alpha1 "github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

// Shared by every test of the package; set up once in TestMain.
var (
	repoRoot   string // the module root
	kubectlBin string // bin/k8s/kubectl
	kubeconfig string // a kubeconfig file for the envtest API server
	tmpDir     string // holds kubeconfig; removed at the end
	k8sClient  client.Client
	testEnv    *envtest.Environment
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := setUp(); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	code := m.Run()
	_ = os.RemoveAll(tmpDir)
	if err := testEnv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: stopping the control plane:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// setUp finds the control-plane binaries, starts the API server with the
// CRDs of config/crd/bases installed, and writes a kubeconfig for kubectl.
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
	kubectlBin = filepath.Join(assets, "kubectl")

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		tiergatev1alpha1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return err
		}
	}

	env, cfg, err := controlplane.Start(root, assets, scheme)
	if err != nil {
		return err
	}
	testEnv = env
	started := false
	defer func() {
		if !started {
			_ = testEnv.Stop()
		}
	}()

	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}

	tmpDir, err = os.MkdirTemp("", "tiergate-integration-")
	if err != nil {
		return err
	}
	kubeconfig = filepath.Join(tmpDir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(testEnv, nil, kubeconfig); err != nil {
		return err
	}
	started = true
	return nil
}

var namespaceSeq atomic.Int64

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("it-%d-%d", os.Getpid(), namespaceSeq.Add(1)),
	}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		// envtest has no namespace controller, so this only marks it
		// Terminating; the objects go with the API server at the end.
		_ = k8sClient.Delete(context.Background(), ns)
	})
	return ns.Name
}

// kubectl runs bin/k8s/kubectl against the test API server. It returns
// stdout, stderr and the error of a failed run (an *exec.ExitError).
func kubectl(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	return kubectlWithInput(t, "", args...)
}

// kubectlWithInput is kubectl with stdin.
func kubectlWithInput(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Dir = repoRoot
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("kubectl %s: timed out", strings.Join(args, " "))
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), err
}
