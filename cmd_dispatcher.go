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
	"github.com/tiergate/tiergate/internal/tokenfile"
)

func init() {
	register("dispatcher", "serve the tiered queue in front of a model pool (data and admin ports)", runDispatcher)
}

// dispatcherFlags are the command's settings: the dispatcher.Config its
// flags fill (their defaults are DefaultConfig's) and what the command
// itself resolves before it builds the Config.
type dispatcherFlags struct {
	cfg                 dispatcher.Config
	tokenFile           string
	tokenGrace          time.Duration
	maxQueued, memLimit int64
	verbosity           int
	logFormat           string
}

// newDispatcherFlags binds the flags of `tiergate dispatcher` to f.
func newDispatcherFlags(stderr io.Writer) (*flag.FlagSet, *dispatcherFlags) {
	fs := flag.NewFlagSet("tiergate dispatcher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &dispatcherFlags{cfg: dispatcher.DefaultConfig()}
	cfg := &f.cfg
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "data port address (clients)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin port address (policy API, healthz, readyz, metrics)")
	fs.StringVar(&f.tokenFile, "admin-token-file", "", "file holding the admin API's bearer token, followed when it changes (a rotated Secret volume); without it PUT/GET /v1/* answer 401")
	fs.DurationVar(&f.tokenGrace, "admin-token-grace", tokenfile.MaxGrace, "after --admin-token-file changes, how long the token it replaced is still accepted (0s to 60s)")
	fs.StringVar(&cfg.PolicyFile, "policy-file", "", "policy document (JSON or YAML) for standalone use; re-read when it changes")
	fleet.AddFlags(fs, &cfg.Fleet) // --state, --redis-password-file, --redis-ca-file, --state-lease-ttl, --state-renew-interval
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM, how long queued requests may still be dispatched before they get 503")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", cfg.MaxBodyBytes, "largest request body; larger gets 413")
	fs.Int64Var(&f.maxQueued, "max-queued-bytes", 0, "memory budget of the request bodies being read and queued; a request whose body would exceed it gets 503 overloaded. 0: a quarter of the smallest known memory limit (GOMEMLIMIT, --memory-limit, the cgroup's), else 256 MiB")
	fs.Int64Var(&f.memLimit, "memory-limit", 0, "the container's memory limit in bytes (the chart passes limits.memory); 0: read the cgroup's. Without GOMEMLIMIT the Go runtime's soft limit is set to 90% of the smallest limit known")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "longest time to receive a request body; slower gets 408")
	fs.DurationVar(&cfg.ReadHeaderTimeout, "read-header-timeout", cfg.ReadHeaderTimeout, "longest time to receive a request's headers (against slowloris clients)")
	addBackendFlags(fs, &cfg.Backend)
	balancer.AddFlags(fs, &cfg.Health) // --backend-eject-after-failures, --backend-eject-after-unreachable, --backend-ejection-base, --backend-ejection-max
	fs.BoolVar(&cfg.Profiling, "enable-profiling", false, "serve Go's runtime profiles (pprof) under /debug/pprof/ on the admin port, behind the admin token")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity: 0 lifecycle and errors, 1 also per-request failures")
	fs.StringVar(&f.logFormat, "log-format", "json", `log format: "json" or "text"`)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tiergate dispatcher [flags]\n\nServes the tiered, ageing, bounded queue in front of a model pool.\n\nFlags:")
		fs.PrintDefaults()
	}
	return fs, f
}

func runDispatcher(args []string, stdout, stderr io.Writer) int {
	fs, f := newDispatcherFlags(stderr)
	if code, done := parseFlags(fs, args, stderr, ""); done {
		return code
	}
	log, err := newLogger(stderr, f.logFormat, f.verbosity)
	if err != nil {
		fmt.Fprintln(stderr, "tiergate dispatcher:", err)
		return 2
	}
	log = log.WithName("dispatcher")
	if f.tokenGrace < 0 || f.tokenGrace > tokenfile.MaxGrace {
		fmt.Fprintf(stderr, "tiergate dispatcher: --admin-token-grace %s must be between 0s and %s\n", f.tokenGrace, tokenfile.MaxGrace)
		return 2
	}
	tokens, err := adminTokens(f.tokenFile, f.tokenGrace, log)
	if err != nil {
		log.Error(err, "cannot read --admin-token-file")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	cfg := f.cfg
	cfg.MaxQueuedBytes, cfg.Log = queuedBytes(f.maxQueued, f.memLimit, log), log
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

// addBackendFlags binds the backends' transport settings, with the
// defaults b holds.
func addBackendFlags(fs *flag.FlagSet, b *dispatcher.Backend) {
	fs.DurationVar(&b.DialTimeout, "backend-dial-timeout", b.DialTimeout, "longest time to connect to a backend, TLS handshake included")
	fs.DurationVar(&b.IdleConnTimeout, "backend-idle-timeout", b.IdleConnTimeout, "an idle keep-alive connection to a backend is closed after this long")
	fs.IntVar(&b.MaxIdleConnsPerHost, "backend-max-idle-conns-per-host", b.MaxIdleConnsPerHost, "idle keep-alive connections kept per backend; at least the pool's slots, or busy pools reconnect")
	fs.DurationVar(&b.ResponseHeaderTimeout, "backend-response-header-timeout", b.ResponseHeaderTimeout, "longest wait for a backend's response headers once the request is sent (504 backend_timeout); long enough for the longest prefill")
	fs.Int64Var(&b.MaxResponseHeaderBytes, "backend-max-response-header-bytes", b.MaxResponseHeaderBytes, "largest response head a backend may send; larger gets the client 502 backend_error")
	fs.StringVar(&b.CAFile, "backend-ca-file", b.CAFile, "PEM CA certificates that https backends are verified against, instead of the system roots")
	fs.StringVar(&b.ServerName, "backend-server-name", b.ServerName, "name that https backends' certificates must hold; empty: the backend's host")
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
