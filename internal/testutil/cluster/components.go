package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The QPS and burst of the components' clients: the defaults (20 and 30 for
// the controller manager) would make a scale of hundreds of pods wait on
// the client's rate limiter rather than on the controllers.
const (
	clientQPS   = 500
	clientBurst = 1000
)

func (c *Cluster) startControllerManager(env *envtest.Environment) error {
	o := c.opts
	api := env.ControlPlane.APIServer
	// envtest's API server signs service-account tokens with this key; the
	// token controller signs the legacy token Secrets with the same one.
	saKey := filepath.Join(api.CertDir, "sa-signer.key")
	if _, err := os.Stat(saKey); err != nil {
		return fmt.Errorf("the API server's service-account signing key: %w", err)
	}
	ca := filepath.Join(o.Dir, "apiserver-ca.crt")
	if err := os.WriteFile(ca, api.CA, 0o600); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	certDir := filepath.Join(o.Dir, "kube-controller-manager-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	c.ControllerManager, err = startComponent("kube-controller-manager", o.Dir, filepath.Join(o.Assets, "kube-controller-manager"), nil,
		"--kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+certDir,
		"--leader-elect=false",
		// Taints come off a Node that turned Ready within a second.
		"--node-monitor-period=1s",
		"--controllers="+strings.Join(o.Controllers, ","),
		"--service-account-private-key-file="+saKey,
		"--root-ca-file="+ca,
		"--use-service-account-credentials=false",
		"--kube-api-qps="+strconv.Itoa(clientQPS),
		"--kube-api-burst="+strconv.Itoa(clientBurst),
		"--v="+strconv.Itoa(o.Verbosity),
	)
	if err != nil {
		return err
	}
	c.ControllerManager.healthz = fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	return nil
}

// schedulerConfig is kube-scheduler's configuration: its client and no
// leader election (one scheduler).
const schedulerConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
  qps: %d
  burst: %d
leaderElection:
  leaderElect: false
`

func (c *Cluster) startScheduler() error {
	o := c.opts
	conf := filepath.Join(o.Dir, "kube-scheduler.yaml")
	if err := os.WriteFile(conf, fmt.Appendf(nil, schedulerConfig, c.Kubeconfig, clientQPS, clientBurst), 0o600); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	certDir := filepath.Join(o.Dir, "kube-scheduler-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	c.Scheduler, err = startComponent("kube-scheduler", o.Dir, filepath.Join(o.Assets, "kube-scheduler"), nil,
		"--config="+conf,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+certDir,
		"--v="+strconv.Itoa(o.Verbosity),
	)
	if err != nil {
		return err
	}
	c.Scheduler.healthz = fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	return nil
}

// kwokConfig raises kwok's pod parallelism (4 workers by default) so a few
// hundred pods changing at once are played in well under a second. kwok
// applies its defaults only when it reads no configuration, so every
// option it needs is set here to its default (v0.8.0's) but that one.
const kwokConfig = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageAllNodes: false
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  enableDebuggingHandlers: false
  enableContentionProfiling: false
  enableProfilingHandler: false
`

// startKwok starts kwok as a controller only: no --node-port or
// --server-address, so it serves nothing. Its HOME is the cluster's
// directory, so no ~/.kwok configuration of the machine is read.
func (c *Cluster) startKwok() error {
	o := c.opts
	home := filepath.Join(o.Dir, "kwok-home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	conf := filepath.Join(o.Dir, "kwok.yaml")
	if err := os.WriteFile(conf, []byte(kwokConfig), 0o600); err != nil {
		return err
	}
	var err error
	c.Kwok, err = startComponent("kwok", o.Dir, filepath.Join(o.Assets, "kwok"), []string{"HOME=" + home},
		"--config="+conf,
		"--kubeconfig="+c.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+NodeAnnotation+"=fake",
		"--cidr="+c.PodCIDR,
		"--node-ip=127.0.0.1",
		"--enable-crds=Stage",
		// kwok renews each Node's Lease, the heartbeat the node-lifecycle
		// controller watches.
		"--node-lease-duration-seconds=40",
	)
	return err
}

// waitHealthy waits until comp's /healthz answers 200 (over TLS with the
// component's own self-signed certificate, which nothing needs to trust).
// /healthz is one of the paths the components allow without credentials,
// so they need no authentication or authorization kubeconfig (whose
// lookups of the request-header CA, which envtest's API server has none
// of, would fill their logs with errors).
func waitHealthy(ctx context.Context, comp *Component, timeout time.Duration) error {
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // a loopback health check of a self-signed test component
	}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, comp.healthz, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		switch {
		case comp.Exited():
			return fmt.Errorf("%s exited while starting (%v):\n%s", comp.Name, comp.Err(), comp.Tail(30))
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("%s not healthy within %s (%v):\n%s", comp.Name, timeout, last, comp.Tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP listener")
	}
	return addr.Port, nil
}
