package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	clusterutil "github.com/tiergate/tiergate/internal/testutil/cluster"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// errInterrupted is the cause of the main context when a signal arrived.
var errInterrupted = errors.New("interrupted")

// The demo's layout: kwok gives pods addresses of one loopback /24.
const (
	dispatchers   = 2 // config/dispatcher's replicas
	dataPort      = 8080
	poolNamespace = "default"
	poolName      = "llm"
	waitWindow    = 10 * time.Second
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.bind(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: go run ./hack/demo [flags]   (make demo [DURATION=30s])\n\n"+
			"Runs tiergate end to end on this machine: a real kube-apiserver, etcd,\n"+
			"kube-controller-manager, kube-scheduler and kwok from bin/k8s, the controller,\n"+
			"2 dispatchers and a simserver behind 6 model pods on loopback,\n"+
			"a mixed load with a live per-tier table, a 6→3→6 scale of the pool, and a\n"+
			"report with charts. Ctrl-C stops everything it started.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if err := cfg.complete(); err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return exitUsage
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return exitUsage
	}

	// envtest and the client log through controller-runtime; the demo
	// shows its own progress instead.
	ctrllog.SetLogger(logr.Discard())
	d := &demo{cfg: cfg, ui: newUI(stdout), plan: defaultPlan()}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	go func() {
		s, ok := <-sigc
		if !ok {
			return
		}
		d.ui.logf("%s: stopping everything the demo started (a second Ctrl-C kills it all at once)", s)
		cancel(errInterrupted)
		if _, ok := <-sigc; ok {
			d.ui.logf("second signal: killing every process now")
			if sup := d.supervisor(); sup != nil {
				sup.killAll()
			}
			os.Exit(exitInterrupted)
		}
	}()

	err := d.run(ctx)
	switch {
	case errors.Is(err, errInterrupted) || errors.Is(context.Cause(ctx), errInterrupted):
		d.ui.logf("interrupted; everything the demo started is stopped")
		return exitInterrupted
	case err != nil:
		fmt.Fprintln(stderr, "demo: FAILED:", err)
		return exitFailed
	}
	return exitOK
}

// demo is one run.
type demo struct {
	cfg  config
	ui   *ui
	plan []streamPlan

	work   string
	mu     sync.Mutex // guards sup (read by the signal handler) and events
	sup    *supervisor
	k      *cluster
	kc     *clusterutil.Cluster
	net    *clusterutil.Network // the model pods' addresses
	stages clusterutil.StageOptions
	// components are the cluster's processes, for the report.
	components []clusterutil.ComponentInfo
	pool       *poolInfo
	subnet     string
	simAddr    string // the simserver behind every model pod
	token      string
	disps      []dispatcherRef
	obs        *observer
	rec        *recorder
	sched      schedule
	replicas   int32 // the Deployment's spec.replicas as last scaled
	// pods are the model pods seen, by UID; lastReady and lastSpec the
	// Deployment's readyReplicas and spec.replicas last read (d.mu).
	pods                map[string]corev1.Pod
	lastReady, lastSpec int32
	clusterSum          *clusterSummary
	events              []*scaleEvent
	follows             sync.WaitGroup
	final               *finalState
	started             time.Time // of the load
	ended               time.Duration
	zero                *zeroRun // the scale-from-zero phase, once it began
	fair                *fairRun // the token-fairness phase, once its load began
	// budgets are the budget stream's tenant's budgets at each dispatcher.
	budgets []policy.Limits
}

func (d *demo) supervisor() *supervisor {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sup
}

// run does the whole demo; teardown always runs, and the report is
// written whenever the load phase began.
func (d *demo) run(ctx context.Context) (err error) {
	if err := checkK8sBin(d.cfg.K8sBin, d.cfg.Root); err != nil {
		return err
	}
	if err := prepareReportDir(d.cfg.Report); err != nil {
		return err
	}
	if err := d.makeWorkDir(); err != nil {
		return err
	}
	d.mu.Lock()
	d.sup = newSupervisor(filepath.Join(d.work, "logs"), d.cfg.PIDFile)
	d.mu.Unlock()

	defer func() {
		d.follows.Wait()
		// What the cluster did, read while the API server still runs.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		d.clusterSum = d.summarizeCluster(sctx)
		cancel()
		d.teardown()
		if d.rec != nil {
			if rerr := d.writeReport(err); rerr != nil {
				err = errors.Join(err, fmt.Errorf("writing the report: %w", rerr))
			}
		}
		d.removeWorkDir(err)
	}()

	if err := d.build(ctx); err != nil {
		return err
	}
	d.ui.logf("starting etcd and kube-apiserver from %s (envtest, real binaries)", d.cfg.K8sBin)
	k, err := startCluster(d.cfg.K8sBin, d.work, d.sup)
	if err != nil {
		return err
	}
	d.k = k
	d.ui.logf("control plane up: %s (kubeconfig %s)", k.env.Config.Host, k.kubeconfig)
	if err := d.apply(ctx); err != nil {
		return err
	}
	if d.pool, err = k.readPool(ctx, poolNamespace, poolName); err != nil {
		return err
	}
	if err := checkPlan(d.plan, d.pool); err != nil {
		return err
	}
	d.replicas = d.pool.Replicas
	d.sched = newSchedule(d.cfg.Duration, d.cfg.Grace, d.pool.Replicas)
	if d.subnet, err = chooseSubnet(d.cfg.Subnet, d.pool, d.cfg.Seed); err != nil {
		return err
	}
	if err := d.writeToken(); err != nil {
		return err
	}
	if err := d.startKwok(ctx); err != nil {
		return err
	}
	if err := d.startDispatchers(ctx); err != nil {
		return err
	}
	if err := d.startController(ctx); err != nil {
		return err
	}
	d.obs = newObserver(d.disps, d.token)
	if err := d.waitSynced(ctx); err != nil {
		return err
	}
	if out, err := k.kubectl(ctx, "-n", d.pool.Namespace, "get", "modelpools,servicetiers"); err == nil {
		d.ui.logf("what the controller computed (kubectl get modelpools,servicetiers):\n%s", indent(out))
	}
	if err := d.readBudgets(ctx); err != nil {
		return err
	}
	if err := d.load(ctx); err != nil {
		return err
	}
	if err := d.zeroPhase(ctx); err != nil {
		return err
	}
	return d.fairPhase(ctx)
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

func (d *demo) makeWorkDir() error {
	if d.cfg.WorkDir == "" {
		w, err := os.MkdirTemp("", "tiergate-demo-")
		if err != nil {
			return err
		}
		d.work = w
	} else {
		if entries, err := os.ReadDir(d.cfg.WorkDir); err == nil && len(entries) > 0 {
			return fmt.Errorf("%w: --workdir %s is not empty", ErrConfig, d.cfg.WorkDir)
		}
		if err := os.MkdirAll(d.cfg.WorkDir, 0o755); err != nil {
			return err
		}
		d.work = d.cfg.WorkDir
	}
	for _, sub := range []string{"bin", "logs"} {
		if err := os.MkdirAll(filepath.Join(d.work, sub), 0o755); err != nil {
			return err
		}
	}
	d.ui.logf("work directory %s", d.work)
	return nil
}

// removeWorkDir keeps the logs in the report, then removes the work
// directory (unless asked to keep it).
func (d *demo) removeWorkDir(runErr error) {
	if d.work == "" {
		return
	}
	for _, dir := range []string{"logs", "cluster"} {
		if err := copyLogs(filepath.Join(d.work, dir), filepath.Join(d.cfg.Report, "logs")); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.ui.logf("could not copy the logs into the report: %v", err)
		}
	}
	if d.cfg.KeepWorkDir {
		d.ui.logf("kept the work directory %s", d.work)
		return
	}
	if err := os.RemoveAll(d.work); err != nil {
		d.ui.logf("could not remove the work directory: %v", err)
	}
}

// build compiles tiergate and the simserver into the work directory.
func (d *demo) build(ctx context.Context) error {
	d.ui.logf("building tiergate and hack/simserver into %s (go build; quick once cached)", filepath.Join(d.work, "bin"))
	// Static and trimmed, as make build compiles the release: the packages
	// compiled for one are reused by the other.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(d.work, "bin")+string(filepath.Separator), ".", "./hack/simserver")
	cmd.Dir = d.cfg.Root
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

func (d *demo) bin(name string) string { return filepath.Join(d.work, "bin", name) }

// apply installs the CRDs, waits for them, and applies the samples and the
// demo's tenants, all with bin/k8s/kubectl.
func (d *demo) apply(ctx context.Context) error {
	steps := [][]string{
		{"apply", "-f", filepath.Join(d.cfg.Root, "config", "crd", "bases")},
		{"wait", "--for=condition=Established", "--timeout=60s", "crd/modelpools.tiergate.dev", "crd/servicetiers.tiergate.dev", "crd/tenantquotas.tiergate.dev"},
		{"apply", "-n", poolNamespace, "-f", filepath.Join(d.cfg.Root, "config", "samples")},
		{"apply", "-n", poolNamespace, "-f", filepath.Join(d.cfg.Root, "hack", "demo", "manifests")},
		{"apply", "-n", poolNamespace, "-k", filepath.Join(d.cfg.Root, "config", "dispatcher")},
	}
	for _, args := range steps {
		out, err := d.k.kubectl(ctx, args...)
		if err != nil {
			return err
		}
		d.ui.logf("kubectl %s\n%s", strings.Join(relPaths(args, d.cfg.Root), " "), indent(out))
	}
	return nil
}

func relPaths(args []string, root string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if r, err := filepath.Rel(root, a); err == nil && filepath.IsAbs(a) && !strings.HasPrefix(r, "..") {
			a = r
		}
		out[i] = a
	}
	return out
}

// chooseSubnet finds a loopback /24 whose every address has the model,
// data and admin ports free: kwok may give a pod any of them.
func chooseSubnet(want string, p *poolInfo, seed uint64) (string, error) {
	candidates := []string{want}
	if want == "auto" {
		rng := mrand.New(mrand.NewPCG(seed, uint64(time.Now().UnixNano())))
		for i := 0; i < 30; i++ {
			candidates = append(candidates, fmt.Sprintf("127.%d.%d", 1+rng.IntN(254), 1+rng.IntN(254)))
		}
		candidates = candidates[1:]
	}
	var last error
	for _, c := range candidates {
		// One port at a time: 254 sockets open at once, not 762.
		for _, port := range []int{p.ModelPort, dataPort, p.AdminPort} {
			var addrs []string
			for host := 1; host < 255; host++ {
				addrs = append(addrs, net.JoinHostPort(fmt.Sprintf("%s.%d", c, host), strconv.Itoa(port)))
			}
			if last = canListen(addrs); last != nil {
				break
			}
		}
		if last == nil {
			return c, nil
		}
	}
	return "", fmt.Errorf("no loopback /24 with free addresses for the demo (last: %w)", last)
}

func canListen(addrs []string) error {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			return err
		}
		ls = append(ls, l)
	}
	return nil
}

func (d *demo) writeToken() error {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	d.token = hex.EncodeToString(b)
	return os.WriteFile(filepath.Join(d.work, "push-token"), []byte(d.token+"\n"), 0o600)
}

func (d *demo) startController(ctx context.Context) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	probe := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	if _, err := d.sup.start("controller", d.bin("tiergate"), "controller",
		"--kubeconfig", d.k.kubeconfig, "--leader-elect", "--leader-election-namespace", d.pool.Namespace,
		"--push-token-file", filepath.Join(d.work, "push-token"), "--resync-period", "10s",
		"--metrics-bind-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		"--health-probe-bind-address", probe); err != nil {
		return err
	}
	if err := d.waitHTTP(ctx, "controller", "http://"+probe+"/healthz"); err != nil {
		return err
	}
	d.ui.logf("controller (tiergate controller --leader-elect --push-token-file ...) is up")
	return nil
}

func freePorts(n int) ([]int, error) {
	var out []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// waitHTTP waits until url answers 200, watching for the process dying.
func (d *demo) waitHTTP(ctx context.Context, name, url string) error {
	c := &http.Client{Transport: newTransport(), Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := d.checkChildren(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer %s within 30s", name, url)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkChildren fails if a child ended on its own.
func (d *demo) checkChildren() error {
	select {
	case p := <-d.sup.Exited():
		return fmt.Errorf("%w: %s (pid %d): %v; last log lines:\n%s", ErrExited, p.Name, p.PID, p.err, tail(p.Log, 2048))
	default:
		return nil
	}
}

// waitSynced waits until every dispatcher holds the controller's policy
// for the full pool.
func (d *demo) waitSynced(ctx context.Context) error {
	want := int(d.pool.Replicas) * d.pool.PerReplica
	d.ui.logf("waiting for the controller to push the policy (%d slots, %d backends) to both dispatchers", want, d.pool.Replicas)
	deadline := time.Now().Add(90 * time.Second)
	for {
		s := d.obs.scrape(ctx)
		if s.OK && s.Slots == want && s.Backends == int(d.pool.Replicas) && s.Ready == len(d.disps) && sameVersions(s.Versions) {
			d.ui.logf("policy %s applied by %d dispatchers: bounds %s", versions(s.Versions), s.Ready, fmtBounds(bounds(s), tierOrder(d.plan)))
			return nil
		}
		if err := d.checkChildren(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the dispatchers did not get the full pool's policy within 90s (last: slots %d, backends %d, ready %d, versions %v, %s); see the logs in %s",
				s.Slots, s.Backends, s.Ready, s.Versions, s.Err, filepath.Join(d.cfg.Report, "logs"))
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func sameVersions(vs []int64) bool {
	for _, v := range vs {
		if v != vs[0] {
			return false
		}
	}
	return len(vs) > 0
}

func fmtBounds(b map[string]int, order []string) string {
	parts := make([]string, 0, len(order))
	for _, t := range order {
		parts = append(parts, fmt.Sprintf("%s %d", t, b[t]))
	}
	return strings.Join(parts, ", ")
}

// teardown stops everything: children (dispatchers, controller,
// simservers) first, then the control plane, then sweeps whatever is left.
func (d *demo) teardown() {
	sup := d.supervisor()
	if sup == nil {
		return
	}
	n := sup.count()
	if n > 0 {
		d.ui.logf("stopping %d processes", n)
	}
	for _, note := range sup.stopAll(10 * time.Second) {
		d.ui.logf("%s", note)
	}
	if err := d.stopKwok(); err != nil {
		d.ui.logf("stopping kwok, kube-scheduler and kube-controller-manager: %v", err)
	}
	if d.k != nil {
		if err := d.k.stop(); err != nil {
			d.ui.logf("stopping the control plane: %v", err)
		}
	}
	if killed := sup.sweep(d.work); len(killed) > 0 {
		d.ui.logf("killed leftovers: %s", strings.Join(killed, ", "))
	}
	if left := pidsMentioning(d.work); len(left) > 0 {
		d.ui.logf("WARNING: processes still running: %v", left)
	} else if n > 0 {
		d.ui.logf("all %d processes stopped; none left", n)
	}
}

// prepareReportDir creates dir, or empties it when it holds a previous
// report (it is never a directory of anything else).
func prepareReportDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	case len(entries) == 0:
	default:
		if _, err := os.Stat(filepath.Join(dir, reportMarker)); err != nil {
			return fmt.Errorf("%w: --report %s exists and is not a demo report (no %s); choose another directory", ErrConfig, dir, reportMarker)
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, reportMarker), []byte("written by hack/demo; the demo replaces this directory on its next run\n"), 0o644)
}

const reportMarker = ".tiergate-demo-report"

func copyLogs(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(to, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		// Keep the last MiB of each log.
		s := tail(filepath.Join(from, e.Name()), 1<<20)
		if err := os.WriteFile(filepath.Join(to, e.Name()), []byte(s+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}
