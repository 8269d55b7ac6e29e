package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/controllers"
)

func init() {
	register("controller", "reconcile ModelPools and push their policies to the dispatchers", runController)
}

func runController(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tiergate controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	metricsAddr := fs.String("metrics-bind-address", ":8080", `address of the metrics endpoint; "0" disables it`)
	probeAddr := fs.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	leaderElect := fs.Bool("leader-elect", true, "elect a leader so only one replica reconciles and pushes")
	leaderNS := fs.String("leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	leaderID := fs.String("leader-election-id", "tiergate-controller.tiergate.dev", "name of the leader election Lease")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	tokenFile := fs.String("push-token-file", "", "file holding the bearer token sent with every policy push (re-read before each push)")
	resync := fs.Duration("resync-period", 30*time.Second, "push to every dispatcher at least this often, even when it holds the current policy")
	pushTimeout := fs.Duration("push-timeout", 5*time.Second, "timeout of one policy push")
	qps := fs.Float64("kube-api-qps", 50, "queries per second to the API server (client-side limit)")
	burst := fs.Int("kube-api-burst", 100, "burst of queries to the API server (client-side limit)")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tiergate controller [flags]\n\nReconciles ModelPools, ServiceTiers and TenantQuotas and pushes each\ndispatcher pod its policy.\n\nFlags:")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, stderr, ""); done {
		return code
	}
	if *qps <= 0 || *burst <= 0 {
		fmt.Fprintf(stderr, "tiergate controller: --kube-api-qps (%v) and --kube-api-burst (%d) must be positive\n", *qps, *burst)
		return 2
	}
	if *resync <= 0 || *pushTimeout <= 0 {
		fmt.Fprintf(stderr, "tiergate controller: --resync-period (%s) and --push-timeout (%s) must be positive\n", *resync, *pushTimeout)
		return 2
	}
	zapOpts.DestWriter = stderr
	logger := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(logger)
	log := logger.WithName("controller")
	if *tokenFile == "" {
		log.Info("no --push-token-file: pushes carry no token and dispatchers that require one answer 401")
	}

	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return 1
	}
	// client-go's default of 5 QPS would delay a scale event's status
	// writes, and the push behind them, by hundreds of milliseconds.
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return 1
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:        *probeAddr,
		LeaderElection:                *leaderElect,
		LeaderElectionID:              *leaderID,
		LeaderElectionNamespace:       *leaderNS,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		log.Error(err, "cannot create the manager")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{
		PushTokenFile: *tokenFile,
		PushTimeout:   *pushTimeout,
		ResyncPeriod:  *resync,
	}); err != nil {
		log.Error(err, "cannot set up the controllers")
		return 1
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "cannot add the health check")
		return 1
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "cannot add the ready check")
		return 1
	}
	log.Info("starting", "leaderElect", *leaderElect, "resyncPeriod", resync.String(), "pushTimeout", pushTimeout.String())
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped")
		return 1
	}
	return 0
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return config.GetConfig()
}
