package dispatcher

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/admin"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/budget"
	"github.com/tiergate/tiergate/dispatcher/fleet"
	"github.com/tiergate/tiergate/dispatcher/forward"
	"github.com/tiergate/tiergate/dispatcher/server"
)

// Defaults of Config, which DefaultConfig gathers; the command's flags
// show the same values.
const (
	DefaultListen             = ":8080"
	DefaultAdminListen        = ":9090"
	DefaultPolicyPollInterval = time.Second
	DefaultDrainTimeout       = 30 * time.Second
	DefaultMaxBodyBytes       = 4 << 20
	DefaultBodyTimeout        = 30 * time.Second
	DefaultMaxQueuedBytes     = budget.DefaultNoLimit
	DefaultReadHeaderTimeout  = 10 * time.Second
	DefaultIdleTimeout        = 120 * time.Second
	DefaultMaxHeaderBytes     = 64 << 10
)

// Config of a dispatcher. It is the one place where the dispatcher's
// settings are defaulted and checked: New fills its zero fields from
// DefaultConfig, validates it, and derives the data path's server.Config
// and the backends' forward.Options from it.
type Config struct {
	Listen      string // data port
	AdminListen string // admin port
	// AdminToken is the admin API's bearer token; empty disables /v1/*.
	AdminToken []byte
	// AdminTokens, when set, checks the bearer token instead of
	// AdminToken (a tokenfile.Follower of a rotated token file).
	AdminTokens admin.Tokens
	// Profiling serves /debug/pprof/ on the admin port, behind its token.
	Profiling bool
	// PolicyFile, when set, is loaded at start and re-read when it changes.
	PolicyFile         string
	PolicyPollInterval time.Duration
	// DrainTimeout is how long queued requests may still be dispatched
	// after shutdown starts.
	DrainTimeout time.Duration
	MaxBodyBytes int64
	BodyTimeout  time.Duration
	// MaxQueuedBytes is the memory budget of the request bodies being read
	// and queued (the command derives it from the memory limit). It must
	// be at least MaxBodyBytes.
	MaxQueuedBytes int64
	// Server timeouts against slow clients. WriteTimeout is not set: a
	// streamed generation may legitimately take minutes.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	// Backend is how the dispatcher connects to the model backends.
	Backend Backend
	// Fleet is fleet mode: with a redis:// or rediss:// URL the queue
	// shares its counts through Redis (dispatcher/fleet); the zero value or
	// URL "local" is local mode.
	Fleet fleet.Config
	// Health is the backends' passive health checking (zero: defaults).
	Health balancer.Health
	// Forwarder reaches the backends (tests); nil builds one from Backend.
	Forwarder *forward.Forwarder
	Clock     clock.WithDelayedExecution // default the real clock
	// Registry receives the metrics; nil makes one with the Go and process
	// collectors.
	Registry *prometheus.Registry
	Log      logr.Logger
}

// Backend is the transport to the backends (forward.Options, whose
// defaults it takes), with the backends' TLS as files and names.
type Backend struct {
	DialTimeout            time.Duration
	IdleConnTimeout        time.Duration
	MaxIdleConnsPerHost    int
	ResponseHeaderTimeout  time.Duration
	MaxResponseHeaderBytes int64
	// CAFile holds PEM CA certificates that https backends are verified
	// against instead of the system roots.
	CAFile string
	// ServerName is the name https backends' certificates are verified
	// for; empty is the backend's host.
	ServerName string
}

// DefaultConfig is the configuration of a dispatcher with no settings.
func DefaultConfig() Config {
	o := forward.DefaultOptions()
	return Config{
		Listen: DefaultListen, AdminListen: DefaultAdminListen,
		PolicyPollInterval: DefaultPolicyPollInterval, DrainTimeout: DefaultDrainTimeout,
		MaxBodyBytes: DefaultMaxBodyBytes, BodyTimeout: DefaultBodyTimeout, MaxQueuedBytes: DefaultMaxQueuedBytes,
		ReadHeaderTimeout: DefaultReadHeaderTimeout, IdleTimeout: DefaultIdleTimeout, MaxHeaderBytes: DefaultMaxHeaderBytes,
		Backend: Backend{
			DialTimeout: o.DialTimeout, IdleConnTimeout: o.IdleConnTimeout, MaxIdleConnsPerHost: o.MaxIdleConnsPerHost,
			ResponseHeaderTimeout: o.ResponseHeaderTimeout, MaxResponseHeaderBytes: o.MaxResponseHeaderBytes,
		},
	}
}

// orDefault is v, or def when v is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (c *Config) defaults() {
	d := DefaultConfig()
	orDefault(&c.Listen, d.Listen)
	orDefault(&c.AdminListen, d.AdminListen)
	orDefault(&c.PolicyPollInterval, d.PolicyPollInterval)
	orDefault(&c.DrainTimeout, d.DrainTimeout)
	orDefault(&c.MaxBodyBytes, d.MaxBodyBytes)
	orDefault(&c.BodyTimeout, d.BodyTimeout)
	orDefault(&c.MaxQueuedBytes, d.MaxQueuedBytes)
	orDefault(&c.ReadHeaderTimeout, d.ReadHeaderTimeout)
	orDefault(&c.IdleTimeout, d.IdleTimeout)
	orDefault(&c.MaxHeaderBytes, d.MaxHeaderBytes)
	b := &c.Backend
	orDefault(&b.DialTimeout, d.Backend.DialTimeout)
	orDefault(&b.IdleConnTimeout, d.Backend.IdleConnTimeout)
	orDefault(&b.MaxIdleConnsPerHost, d.Backend.MaxIdleConnsPerHost)
	orDefault(&b.ResponseHeaderTimeout, d.Backend.ResponseHeaderTimeout)
	orDefault(&b.MaxResponseHeaderBytes, d.Backend.MaxResponseHeaderBytes)
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
		c.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.PolicyPollInterval < 0 {
		errs = append(errs, fmt.Errorf("policy poll interval must be > 0, got %s", c.PolicyPollInterval))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("--drain-timeout must be >= 0, got %s", c.DrainTimeout))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-body-bytes must be > 0, got %d", c.MaxBodyBytes))
	}
	if c.MaxQueuedBytes < c.MaxBodyBytes {
		errs = append(errs, fmt.Errorf("--max-queued-bytes (%s) must be at least --max-body-bytes (%s): a body of the largest size would never fit",
			budget.FormatBytes(c.MaxQueuedBytes), budget.FormatBytes(c.MaxBodyBytes)))
	}
	if c.BodyTimeout < 0 || c.ReadHeaderTimeout < 0 || c.IdleTimeout < 0 {
		errs = append(errs, errors.New("server timeouts must be > 0"))
	}
	if c.MaxHeaderBytes < 0 {
		errs = append(errs, fmt.Errorf("max header bytes must be > 0, got %d", c.MaxHeaderBytes))
	}
	errs = append(errs, c.Backend.validate()...)
	if err := c.Health.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (b *Backend) validate() []error {
	var errs []error
	positive := func(flag string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fmt.Errorf("--%s must be > 0, got %s", flag, d))
		}
	}
	positive("backend-dial-timeout", b.DialTimeout)
	positive("backend-idle-timeout", b.IdleConnTimeout)
	positive("backend-response-header-timeout", b.ResponseHeaderTimeout)
	if b.MaxIdleConnsPerHost < 0 {
		errs = append(errs, fmt.Errorf("--backend-max-idle-conns-per-host must be > 0, got %d", b.MaxIdleConnsPerHost))
	}
	if b.MaxResponseHeaderBytes < 0 {
		errs = append(errs, fmt.Errorf("--backend-max-response-header-bytes must be > 0, got %d", b.MaxResponseHeaderBytes))
	}
	return errs
}

// ErrNoCertificate is the error of a --backend-ca-file with no PEM
// certificate in it, which would otherwise make every https backend fail
// verification.
var ErrNoCertificate = errors.New("holds no PEM certificate")

// tlsConfig is the client TLS of https backends: nil (the system roots)
// unless a CA file or a server name is set.
func (b *Backend) tlsConfig() (*tls.Config, error) {
	if b.CAFile == "" && b.ServerName == "" {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: b.ServerName, MinVersion: tls.VersionTLS12}
	if b.CAFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(b.CAFile)
	if err != nil {
		return nil, fmt.Errorf("--backend-ca-file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--backend-ca-file %s %w", b.CAFile, ErrNoCertificate)
	}
	cfg.RootCAs = roots
	return cfg, nil
}

// forwardOptions are the backends' transport options.
func (b *Backend) forwardOptions() (forward.Options, error) {
	tlsCfg, err := b.tlsConfig()
	if err != nil {
		return forward.Options{}, err
	}
	return forward.Options{
		DialTimeout: b.DialTimeout, MaxIdleConnsPerHost: b.MaxIdleConnsPerHost, IdleConnTimeout: b.IdleConnTimeout,
		ResponseHeaderTimeout: b.ResponseHeaderTimeout, MaxResponseHeaderBytes: b.MaxResponseHeaderBytes, TLS: tlsCfg,
	}, nil
}

// serverConfig is the data path's configuration, with the forwarder
// built from Backend unless the caller gave one.
func (c *Config) serverConfig() (server.Config, error) {
	fwd := c.Forwarder
	if fwd == nil {
		opts, err := c.Backend.forwardOptions()
		if err != nil {
			return server.Config{}, err
		}
		fwd = forward.New(opts)
	}
	return server.Config{
		MaxBodyBytes: c.MaxBodyBytes, BodyTimeout: c.BodyTimeout, MaxQueuedBytes: c.MaxQueuedBytes,
		Forwarder: fwd, Log: c.Log.WithName("data"),
	}, nil
}
