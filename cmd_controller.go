package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
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

// controllerFlags are the flags of `tiergate controller`.
type controllerFlags struct {
	metricsAddr, probeAddr string
	// pprofAddr serves Go's runtime profiles; "0" (the default) serves none.
	pprofAddr          string
	leaderElect        bool
	leaderNS, leaderID string
	kubeconfig         string
	tokenSecret        string
	qps                float64
	burst              int
	zap                zap.Options
	// cfg is the controllers' configuration: its flags take their defaults
	// from controllers.DefaultConfig and parseControllerFlags validates it.
	cfg controllers.Config
}

func runController(args []string, _, stderr io.Writer) int {
	f, code, done := parseControllerFlags(args, stderr)
	if done {
		return code
	}
	f.zap.DestWriter = stderr
	logger := zap.New(zap.UseFlagOptions(&f.zap))
	ctrl.SetLogger(logger)
	log := logger.WithName("controller")
	if f.cfg.PushTokenFile == "" && f.tokenSecret == "" {
		log.Info("no --push-token-file: pushes carry no token and dispatchers that require one answer 401")
	}
	mgr, err := newControllerManager(f)
	if err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := controllers.Setup(ctx, mgr, f.cfg); err != nil {
		log.Error(err, "cannot set up the controllers")
		return 1
	}
	return startManager(ctx, mgr, log, f)
}

func parseControllerFlags(args []string, stderr io.Writer) (f controllerFlags, code int, done bool) {
	f.cfg = controllers.DefaultConfig()
	fs := flag.NewFlagSet("tiergate controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", `address of the metrics endpoint; "0" disables it`)
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "0", `address that serves Go's runtime profiles (net/http/pprof, unauthenticated: bind it to localhost); "0" disables it`)
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "elect a leader so only one replica reconciles and pushes")
	fs.StringVar(&f.leaderNS, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.StringVar(&f.leaderID, "leader-election-id", "tiergate-controller.tiergate.dev", "name of the leader election Lease")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&f.tokenSecret, "push-token-secret", "", "NAMESPACE/NAME of the push token Secret to create with a random token when it is missing; its token serves until --push-token-file exists")
	fs.Float64Var(&f.qps, "kube-api-qps", 50, "queries per second to the API server (client-side limit)")
	fs.IntVar(&f.burst, "kube-api-burst", 100, "burst of queries to the API server (client-side limit)")
	bindConfigFlags(fs, &f.cfg)
	f.zap.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tiergate controller [flags]\n\nReconciles ModelPools, ServiceTiers and TenantQuotas and pushes each\ndispatcher pod its policy.\n\nFlags:")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, stderr, ""); done {
		return f, code, true
	}
	if f.qps <= 0 || f.burst <= 0 {
		fmt.Fprintf(stderr, "tiergate controller: --kube-api-qps (%v) and --kube-api-burst (%d) must be positive\n", f.qps, f.burst)
		return f, 2, true
	}
	secret, err := tokenSecretName(f.tokenSecret)
	if err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return f, 2, true
	}
	f.cfg.PushTokenSecret = secret
	if err := f.cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return f, 2, true
	}
	return f, 0, false
}

// bindConfigFlags binds the flags of the controllers' configuration; each
// takes its default from the value cfg holds (controllers.DefaultConfig).
func bindConfigFlags(fs *flag.FlagSet, cfg *controllers.Config) {
	fs.StringVar(&cfg.PushTokenFile, "push-token-file", cfg.PushTokenFile, "file holding the bearer token sent with every policy push (followed as a mounted Secret is rotated)")
	fs.StringVar(&cfg.PushTokenSecretKey, "push-token-secret-key", cfg.PushTokenSecretKey, "key of the token in --push-token-secret")
	fs.DurationVar(&cfg.ResyncPeriod, "resync-period", cfg.ResyncPeriod, "push to every dispatcher at least this often, even when it holds the current policy")
	fs.DurationVar(&cfg.PushTimeout, "push-timeout", cfg.PushTimeout, "timeout of one policy push")
	fs.IntVar(&cfg.PushWorkers, "push-workers", cfg.PushWorkers, "policy pushes that run at once, to different dispatcher pods")
	fs.StringVar(&cfg.PrometheusAddress, "prometheus-address", cfg.PrometheusAddress, "Prometheus server (http or https URL) that KEDA ScaledObjects query when a pool's spec.autoscaling.prometheus.serverAddress is empty")
	fs.StringVar(&cfg.JWKSCAFile, "jwks-ca-file", cfg.JWKSCAFile, "PEM file of CA certificates trusted, besides the system roots, for ModelPool spec.authentication.jwt.jwks.url")
	fs.DurationVar(&cfg.JWKSMinRefetch, "jwks-min-refetch-interval", cfg.JWKSMinRefetch, "shortest time between two fetches of one JWKS URL that an unknown key ID or a failed fetch asks for")
}

// newControllerManager connects to the API server and builds the manager
// with the tiergate types in its scheme.
func newControllerManager(f controllerFlags) (ctrl.Manager, error) {
	cfg, err := restConfig(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	// client-go's default of 5 QPS would delay a scale event's status
	// writes, and the push behind them, by hundreds of milliseconds.
	cfg.QPS, cfg.Burst = float32(f.qps), f.burst
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: f.metricsAddr},
		HealthProbeBindAddress:        f.probeAddr,
		PprofBindAddress:              f.pprofAddr,
		LeaderElection:                f.leaderElect,
		LeaderElectionID:              f.leaderID,
		LeaderElectionNamespace:       f.leaderNS,
		LeaderElectionReleaseOnCancel: true,
		// Only the Secrets labelled tiergate.dev/api-keys and the
		// ConfigMaps labelled tiergate.dev/jwks are listed, watched and kept.
		Cache: cache.Options{ByObject: controllers.CacheByObject()},
	})
	if err != nil {
		return nil, fmt.Errorf("cannot create the manager: %w", err)
	}
	return mgr, nil
}

// startManager adds the health checks and runs the manager until ctx ends.
func startManager(ctx context.Context, mgr ctrl.Manager, log logr.Logger, f controllerFlags) int {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "cannot add the health check")
		return 1
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "cannot add the ready check")
		return 1
	}
	log.Info("starting", "leaderElect", f.leaderElect, "resyncPeriod", f.cfg.ResyncPeriod.String(), "pushTimeout", f.cfg.PushTimeout.String(),
		"pushWorkers", f.cfg.PushWorkers, "prometheusAddress", f.cfg.PrometheusAddress)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped")
		return 1
	}
	return 0
}

// tokenSecretName parses --push-token-secret: "" or NAMESPACE/NAME.
func tokenSecretName(s string) (types.NamespacedName, error) {
	if s == "" {
		return types.NamespacedName{}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("--push-token-secret %q must be NAMESPACE/NAME", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return config.GetConfig()
}
