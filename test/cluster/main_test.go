package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

// Shared by every test of the package; set up once in TestMain.
var (
	repoRoot string
	tmpDir   string
	bins     testutil.Binaries
	testEnv  *envtest.Environment
	k8s      client.Client
	kubectl  testutil.Tool
	kc       *cluster.Cluster
	podNet   *cluster.Network
	sim      *testutil.Process
	simAddr  string
)

// coldStart is the model pods' cold start (their template's annotation):
// long enough to tell from the controllers' own latency.
const coldStart = 2 * time.Second

// terminationDelay is how long a deleted model pod stays terminating.
const terminationDelay = 1500 * time.Millisecond

// crashDetection is how long a pod crashed by the chaos label stays
// listed Ready (the kubelet noticing), while its address refuses dials.
const crashDetection = 500 * time.Millisecond

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := setUp(); err != nil {
		fmt.Fprintln(os.Stderr, "test/cluster:", err)
		if kc != nil {
			fmt.Fprintln(os.Stderr, kc.Logs(40))
		}
		_ = tearDown()
		return 1
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, kc.Logs(60))
	}
	if err := tearDown(); err != nil {
		fmt.Fprintln(os.Stderr, "test/cluster: tearing down:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
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
	if tmpDir, err = os.MkdirTemp("", "tiergate-cluster-e2e-"); err != nil {
		return err
	}
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
	started := time.Now()
	env, cfg, err := controlplane.Start(root, assets, scheme, cluster.APIServerOptions()...)
	if err != nil {
		return err
	}
	testEnv = env
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	apiUp := time.Since(started)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if kc, err = cluster.Start(ctx, env, cfg, cluster.Options{
		Assets:   assets,
		StageCRD: filepath.Join(root, "bin", "kwok", "kwok.x-k8s.io_stages.yaml"),
		Dir:      filepath.Join(tmpDir, "cluster"),
		Nodes:    3,
		Stages:   cluster.StageOptions{ColdStart: coldStart, TerminationDelay: terminationDelay, CrashDetection: crashDetection},
	}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "test/cluster: API server up in %s, controller manager, scheduler, kwok and 3 Ready Nodes %s later (pod CIDR %s)\n",
		apiUp.Round(time.Millisecond), (time.Since(started) - apiUp).Round(time.Millisecond), kc.PodCIDR)
	kubectl = testutil.Kubectl(filepath.Join(assets, "kubectl"), kc.Kubeconfig)
	if err := startSimserver(); err != nil {
		return err
	}
	podNet, err = kc.Network(ctx, 0, simAddr)
	return err
}

// startSimserver starts the one model server every pod address relays to.
func startSimserver() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	simAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bins.Simserver, "--listen", simAddr, "--concurrency", "64", "--service-time", "const:20ms")
	if sim, err = testutil.Start(cmd); err != nil {
		return err
	}
	return testutil.Poll(20*time.Second, func() error {
		if sim.Exited() {
			return fmt.Errorf("simserver exited: %v\n%s", sim.Err(), sim.Output())
		}
		resp, err := http.Get("http://" + simAddr + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

func freePort() (int, error) {
	ports, err := testutil.FreePorts("127.0.0.1", 1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

func tearDown() error {
	var errs []error
	if kc != nil {
		errs = append(errs, kc.Stop())
	}
	if sim != nil {
		sim.Stop(5 * time.Second)
	}
	if testEnv != nil {
		errs = append(errs, testEnv.Stop())
	}
	if tmpDir != "" {
		errs = append(errs, os.RemoveAll(tmpDir))
	}
	return errors.Join(errs...)
}
