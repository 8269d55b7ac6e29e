package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/tiergate/tiergate/dispatcher"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/budget"
	"github.com/tiergate/tiergate/dispatcher/fleet"
	"github.com/tiergate/tiergate/dispatcher/server"
	"github.com/tiergate/tiergate/internal/tokenfile"
)

func init() {
	register("dispatcher", "serve the tiered queue in front of a model pool (data and admin ports)", runDispatcher)
}

func runDispatcher(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tiergate dispatcher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", ":8080", "data port address (clients)")
	adminListen := fs.String("admin-listen", ":9090", "admin port address (policy API, healthz, readyz, metrics)")
	tokenFile := fs.String("admin-token-file", "", "file holding the admin API's bearer token, followed when it changes (a rotated Secret volume); without it PUT/GET /v1/* answer 401")
	tokenGrace := fs.Duration("admin-token-grace", tokenfile.MaxGrace, "after --admin-token-file changes, how long the token it replaced is still accepted (0s to 60s)")
	policyFile := fs.String("policy-file", "", "policy document (JSON or YAML) for standalone use; re-read when it changes")
	var fleetCfg fleet.Config
	fleet.AddFlags(fs, &fleetCfg) // --state, --redis-password-file, --redis-ca-file, --state-lease-ttl, --state-renew-interval
	drainTimeout := fs.Duration("drain-timeout", dispatcher.DefaultDrainTimeout, "on SIGTERM, how long queued requests may still be dispatched before they get 503")
	maxBody := fs.Int64("max-body-bytes", server.DefaultMaxBodyBytes, "largest request body; larger gets 413")
	maxQueued := fs.Int64("max-queued-bytes", 0, "memory budget of the request bodies being read and queued; a request whose body would exceed it gets 503 overloaded. 0: a quarter of the smallest known memory limit (GOMEMLIMIT, --memory-limit, the cgroup's), else 256 MiB")
	memLimit := fs.Int64("memory-limit", 0, "the container's memory limit in bytes (the chart passes limits.memory); 0: read the cgroup's. Without GOMEMLIMIT the Go runtime's soft limit is set to 90% of the smallest limit known")
	bodyTimeout := fs.Duration("body-timeout", server.DefaultBodyTimeout, "longest time to receive a request body; slower gets 408")
	readHeaderTimeout := fs.Duration("read-header-timeout", 10*time.Second, "longest time to receive a request's headers (against slowloris clients)")
	var health balancer.Health
	balancer.AddFlags(fs, &health) // --backend-eject-after-failures, --backend-eject-after-unreachable, --backend-ejection-base, --backend-ejection-max
	profiling := fs.Bool("enable-profiling", false, "serve Go's runtime profiles (pprof) under /debug/pprof/ on the admin port, behind the admin token")
	verbosity := fs.Int("v", 0, "log verbosity: 0 lifecycle and errors, 1 also per-request failures")
	logFormat := fs.String("log-format", "json", `log format: "json" or "text"`)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tiergate dispatcher [flags]\n\nServes the tiered, ageing, bounded queue in front of a model pool.\n\nFlags:")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, stderr, ""); done {
		return code
	}
	log, err := newLogger(stderr, *logFormat, *verbosity)
	if err != nil {
		fmt.Fprintln(stderr, "tiergate dispatcher:", err)
		return 2
	}
	log = log.WithName("dispatcher")
	if *tokenGrace < 0 || *tokenGrace > tokenfile.MaxGrace {
		fmt.Fprintf(stderr, "tiergate dispatcher: --admin-token-grace %s must be between 0s and %s\n", *tokenGrace, tokenfile.MaxGrace)
		return 2
	}
	tokens, err := adminTokens(*tokenFile, *tokenGrace, log)
	if err != nil {
		log.Error(err, "cannot read --admin-token-file")
		return 2
	}

	queued := queuedBytes(*maxQueued, *memLimit, log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	cfg := dispatcher.Config{
		Listen: *listen, AdminListen: *adminListen, PolicyFile: *policyFile,
		DrainTimeout: *drainTimeout, MaxBodyBytes: *maxBody, BodyTimeout: *bodyTimeout, MaxQueuedBytes: queued,
		ReadHeaderTimeout: *readHeaderTimeout, Fleet: fleetCfg, Health: health, Profiling: *profiling, Log: log,
	}
	if tokens != nil {
		cfg.AdminTokens = tokens
		go tokens.Run(ctx)
	}
	d, err := dispatcher.New(cfg)
	if err != nil {
		log.Error(err, "bad configuration")
		return 2
	}
	if err := d.ListenAndServe(ctx); err != nil {
		log.Error(err, "dispatcher failed")
		return 1
	}
	return 0
}

// adminTokens follows the admin token file, which must hold a token at
// start; nil without a file.
func adminTokens(path string, grace time.Duration, log logr.Logger) (*tokenfile.Follower, error) {
	if path == "" {
		return nil, nil
	}
	f, err := tokenfile.New(tokenfile.Options{Path: path, Grace: grace, Log: log.WithName("admin-token")})
	if err != nil {
		return nil, err
	}
	if _, err := f.Poll(); err != nil {
		return nil, err
	}
	return f, nil
}

// queuedBytes is the body budget: flagged when not 0, else derived from the
// memory limits known (budget.Default). Without GOMEMLIMIT it also sets
// the runtime's soft memory limit from the other limits, so the collector
// works harder before the kernel would kill the process.
func queuedBytes(flagged, container int64, log logr.Logger) int64 {
	lim := budget.Limits{Container: container, Cgroup: budget.CgroupLimit(os.DirFS("/"))}
	if g := debug.SetMemoryLimit(-1); g != math.MaxInt64 {
		lim.GoMemLimit = g
	}
	if soft := budget.SoftLimit(lim); soft > 0 {
		debug.SetMemoryLimit(soft)
		_, what := lim.Smallest()
		log.Info("set the Go soft memory limit", "bytes", soft, "from", "90% of "+what)
	}
	if flagged != 0 { // a negative one is refused by the configuration's check
		log.Info("queued body budget", "bytes", flagged, "from", "--max-queued-bytes")
		return flagged
	}
	n, why := budget.Default(lim)
	log.Info("queued body budget", "bytes", n, "from", why)
	return n
}

// newLogger builds the dispatcher's logr.Logger on w.
func newLogger(w io.Writer, format string, verbosity int) (logr.Logger, error) {
	opts := funcr.Options{Verbosity: verbosity, LogTimestamp: true, LogCaller: funcr.None}
	switch format {
	case "json":
		return funcr.NewJSON(func(obj string) { fmt.Fprintln(w, obj) }, opts), nil
	case "text":
		return funcr.New(func(prefix, args string) { fmt.Fprintln(w, prefix, args) }, opts), nil
	}
	return logr.Logger{}, fmt.Errorf("--log-format must be json or text, got %q", format)
}
