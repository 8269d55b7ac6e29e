package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

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
	leaderElect            bool
	leaderNS, leaderID     string
	kubeconfig, tokenFile  string
	prometheusAddr         string
	tokenSecret, tokenKey  string
	resync, pushTimeout    time.Duration
	jwksCAFile             string
	jwksMinRefetch         time.Duration
	qps                    float64
	burst                  int
	zap                    zap.Options
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
	if f.tokenFile == "" && f.tokenSecret == "" {
		log.Info("no --push-token-file: pushes carry no token and dispatchers that require one answer 401")
	}
	mgr, err := newControllerManager(f)
	if err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	secret, _ := tokenSecretName(f.tokenSecret) // checked by parseControllerFlags
	if err := controllers.Setup(ctx, mgr, controllers.Options{
		PushTokenFile:      f.tokenFile,
		PushTokenSecret:    secret,
		PushTokenSecretKey: f.tokenKey,
		PushTimeout:        f.pushTimeout,
		ResyncPeriod:       f.resync,
		PrometheusAddress:  f.prometheusAddr,
		JWKS:               controllers.JWKSFetcherOptions{CAFile: f.jwksCAFile, MinRefetch: f.jwksMinRefetch},
	}); err != nil {
		log.Error(err, "cannot set up the controllers")
		return 1
	}
	return startManager(ctx, mgr, log, f)
}

func parseControllerFlags(args []string, stderr io.Writer) (f controllerFlags, code int, done bool) {
	fs := flag.NewFlagSet("tiergate controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", `address of the metrics endpoint; "0" disables it`)
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "elect a leader so only one replica reconciles and pushes")
	fs.StringVar(&f.leaderNS, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.StringVar(&f.leaderID, "leader-election-id", "tiergate-controller.tiergate.dev", "name of the leader election Lease")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&f.tokenFile, "push-token-file", "", "file holding the bearer token sent with every policy push (followed as a mounted Secret is rotated)")
	fs.StringVar(&f.tokenSecret, "push-token-secret", "", "NAMESPACE/NAME of the push token Secret to create with a random token when it is missing; its token serves until --push-token-file exists")
	fs.StringVar(&f.tokenKey, "push-token-secret-key", "token", "key of the token in --push-token-secret")
	fs.DurationVar(&f.resync, "resync-period", 30*time.Second, "push to every dispatcher at least this often, even when it holds the current policy")
	fs.DurationVar(&f.pushTimeout, "push-timeout", 5*time.Second, "timeout of one policy push")
	fs.StringVar(&f.prometheusAddr, "prometheus-address", "", "Prometheus server (http or https URL) that KEDA ScaledObjects query when a pool's spec.autoscaling.prometheus.serverAddress is empty")
	fs.StringVar(&f.jwksCAFile, "jwks-ca-file", "", "PEM file of CA certificates trusted, besides the system roots, for ModelPool spec.authentication.jwt.jwks.url")
	fs.DurationVar(&f.jwksMinRefetch, "jwks-min-refetch-interval", 30*time.Second, "shortest time between two fetches of one JWKS URL that an unknown key ID or a failed fetch asks for")
	fs.Float64Var(&f.qps, "kube-api-qps", 50, "queries per second to the API server (client-side limit)")
	fs.IntVar(&f.burst, "kube-api-burst", 100, "burst of queries to the API server (client-side limit)")
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
	if msg := checkPrometheusAddress(f.prometheusAddr); msg != "" {
		fmt.Fprintf(stderr, "tiergate controller: --prometheus-address %q %s\n", f.prometheusAddr, msg)
		return f, 2, true
	}
	if _, err := tokenSecretName(f.tokenSecret); err != nil {
		fmt.Fprintln(stderr, "tiergate controller:", err)
		return f, 2, true
	}
	if f.jwksMinRefetch <= 0 {
		fmt.Fprintf(stderr, "tiergate controller: --jwks-min-refetch-interval (%s) must be positive\n", f.jwksMinRefetch)
		return f, 2, true
	}
	if f.resync <= 0 || f.pushTimeout <= 0 {
		fmt.Fprintf(stderr, "tiergate controller: --resync-period (%s) and --push-timeout (%s) must be positive\n", f.resync, f.pushTimeout)
		return f, 2, true
	}
	return f, 0, false
}

// checkPrometheusAddress says what is wrong with a --prometheus-address,
// "" when nothing is: the CRD holds a pool's own address to the same rule.
func checkPrometheusAddress(a string) string {
	if a == "" {
		return ""
	}
	u, err := url.Parse(a)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return "must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090"
	}
	return ""
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
	log.Info("starting", "leaderElect", f.leaderElect, "resyncPeriod", f.resync.String(), "pushTimeout", f.pushTimeout.String(), "prometheusAddress", f.prometheusAddr)
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
